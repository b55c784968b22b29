"""The package's constrained beam search (``decoding.recommend``) checked against an exhaustive teacher-forced
ranking; SIDs of several lengths through the ``generate`` reference (``helpers/generate_reference.py``)."""

from __future__ import annotations

import pytest
import torch
from helpers.decoding_fixtures import (
    N_ITEMS,
    QUESTIONS,
    add_sid_tokens,
    chat_prompts,
    exhaustive_scores,
    make_catalogue,
)
from helpers.generate_reference import generate_recommend

from peft_grounded.decoding import Recommendations, SIDTrie, recommend
from peft_grounded.decoding.search import _collect


def assert_matches_exhaustive(model, tokenizer, prompts, catalogue, recs: Recommendations, k: int) -> None:
    for p, prompt in enumerate(prompts):
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        scores = exhaustive_scores(model, ids, catalogue)
        ranking = sorted(scores, key=lambda item: -scores[item])[:k]
        assert recs.items[p] == ranking, f"prompt {p}"
        torch.testing.assert_close(recs.scores[p], [scores[i] for i in ranking], atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize(
    ("arch", "tied", "extra_rows"),
    [("llama", True, 0), ("llama", False, 0), ("qwen3", True, 0), ("qwen3", False, 64)],
)
def test_wide_beam_equals_exhaustive_ranking(tokenizer, tiny_model_factory, arch, tied, extra_rows):
    model = tiny_model_factory(arch=arch, tied=tied, extra_rows=extra_rows)
    add_sid_tokens(tokenizer, model)
    catalogue = make_catalogue(tokenizer)
    prompts = chat_prompts(tokenizer)
    recs = recommend(model, tokenizer, prompts, catalogue, k=20, num_beams=N_ITEMS + 4, batch_size=3)
    assert_matches_exhaustive(model, tokenizer, prompts, catalogue, recs, k=20)
    assert recs.num_invalid == recs.num_duplicate == 0
    assert recs.num_filler == 4 * len(prompts)  # the beams beyond the 30 items are padding, dropped


def test_variable_length_sids_end_at_the_end_token(tokenizer, tiny_model_factory):
    model = tiny_model_factory(arch="llama", tied=False)
    add_sid_tokens(tokenizer, model)
    full = make_catalogue(tokenizer, n_items=40, seed=1)
    a0 = tokenizer.convert_tokens_to_ids("<a_0>")
    # Items under <a_0> lose their last level: prefix-free, lengths 2 and 3.
    catalogue: dict[str, list[int]] = {}
    for item, sid in full.items():
        short = sid[:2] if sid[0] == a0 else sid
        if short not in catalogue.values():
            catalogue[item] = short
    assert {len(s) for s in catalogue.values()} == {2, 3}
    prompts = chat_prompts(tokenizer)[:2]
    recs = (
        generate_recommend(  # the reference (transformers' generate) ends them; the package's engine refuses
            model,
            tokenizer,
            prompts,
            catalogue,
            k=10,
            num_beams=len(catalogue),
            end_token_id=tokenizer.eos_token_id,
        )
    )
    assert_matches_exhaustive(model, tokenizer, prompts, catalogue, recs, k=10)
    assert any(len(catalogue[i]) == 2 for items in recs.items for i in items)
    trie = SIDTrie(catalogue, end_token_id=tokenizer.eos_token_id)
    with pytest.raises(ValueError, match="SIDs of one length"):
        recommend(model, tokenizer, prompts, trie, k=10, num_beams=len(catalogue))


def test_zero_invalid_sids_where_the_model_prefers_other_tokens(tokenizer, tiny_model_factory):
    model = tiny_model_factory(arch="qwen3", tied=True)
    add_sid_tokens(tokenizer, model, scale=None)  # mean-initialised rows, as after a plain resize
    catalogue = make_catalogue(tokenizer)
    sid_tokens = {t for sid in catalogue.values() for t in sid}
    prompts = chat_prompts(tokenizer)
    encoded = tokenizer(prompts[1], return_tensors="pt", add_special_tokens=False)
    free = model.generate(**encoded, num_beams=8, num_return_sequences=8, max_new_tokens=3, do_sample=False)
    assert any(t not in sid_tokens for t in free[:, encoded.input_ids.shape[1] :].flatten().tolist())

    recs = recommend(model, tokenizer, prompts, catalogue, k=10, num_beams=12)
    assert recs.num_invalid == recs.num_duplicate == 0 and recs.invalid_rate == 0.0
    assert all(len(set(items)) == 10 and set(items) <= set(catalogue) for items in recs.items)
    # Narrow beams are approximate, but each reported score is still the item's teacher-forced score.
    for p, prompt in enumerate(prompts):
        scores = exhaustive_scores(model, tokenizer(prompt, add_special_tokens=False)["input_ids"], catalogue)
        torch.testing.assert_close(recs.scores[p], [scores[i] for i in recs.items[p]], atol=1e-4, rtol=0)


def test_checkpoint_generation_config_cannot_change_the_result(tokenizer, tiny_model_factory):
    model = tiny_model_factory(arch="llama", tied=True)
    add_sid_tokens(tokenizer, model)
    catalogue = make_catalogue(tokenizer)
    prompts = chat_prompts(tokenizer)
    clean = recommend(model, tokenizer, prompts, catalogue, k=10, num_beams=N_ITEMS)

    best_first_token = catalogue[clean.items[0][0]][0]
    config = model.generation_config
    config.do_sample, config.temperature, config.top_p, config.top_k = True, 0.3, 0.5, 3
    config.repetition_penalty, config.length_penalty, config.num_beams = 2.0, 5.0, 1
    config.suppress_tokens = [best_first_token]  # would remove the top item if it leaked into the call
    config.bad_words_ids = [[catalogue[clean.items[1][0]][0]]]
    model.train()
    torch.manual_seed(123)
    noisy = recommend(model, tokenizer, prompts, catalogue, k=10, num_beams=N_ITEMS)
    assert noisy.items == clean.items
    torch.testing.assert_close(noisy.scores, clean.scores, atol=1e-5, rtol=0)
    assert model.generation_config is config and config.do_sample is True  # restored
    assert model.training  # restored


def test_batched_left_padding_equals_one_by_one(tokenizer, tiny_model_factory):
    model = tiny_model_factory(arch="qwen3", tied=False)
    add_sid_tokens(tokenizer, model)
    catalogue = make_catalogue(tokenizer)
    prompts = chat_prompts(tokenizer, [*QUESTIONS, "Hi", "What now, given <a_2><b_0><c_1>?"])
    batched = recommend(
        model, tokenizer, prompts, SIDTrie(catalogue), k=5, num_beams=8, batch_size=len(prompts)
    )
    single = recommend(model, tokenizer, prompts, catalogue, k=5, num_beams=8, batch_size=1)
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    from_ids = recommend(model, None, ids, catalogue, k=5, num_beams=8, batch_size=2)
    uncached = generate_recommend(
        model, tokenizer, prompts, catalogue, k=5, num_beams=8, batch_size=3, prefix_cache=False
    )
    assert batched.items == single.items == from_ids.items == uncached.items
    torch.testing.assert_close(batched.scores, single.scores, atol=1e-4, rtol=0)
    torch.testing.assert_close(batched.scores, uncached.scores, atol=1e-4, rtol=0)
    assert len({len(i) for i in ids}) == len(ids)  # the batch really needed padding


def test_peft_wrapped_model_decodes_like_its_base(tokenizer, tiny_model_factory):
    from peft import LoraConfig, get_peft_model

    model = tiny_model_factory(arch="llama", tied=False)
    add_sid_tokens(tokenizer, model)
    catalogue = make_catalogue(tokenizer)
    prompts = chat_prompts(tokenizer)[:2]
    base = recommend(model, tokenizer, prompts, catalogue, k=5, num_beams=10)
    model.generation_config.do_sample, model.generation_config.top_k = True, 2
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))  # B = 0: no-op
    wrapped = recommend(peft_model, tokenizer, prompts, catalogue, k=5, num_beams=10)
    assert wrapped.items == base.items
    torch.testing.assert_close(wrapped.scores, base.scores, atol=1e-5, rtol=0)


def test_bad_requests_are_refused(tokenizer, tiny_model_factory):
    model = tiny_model_factory()
    add_sid_tokens(tokenizer, model, scale=None)
    catalogue = make_catalogue(tokenizer, n_items=12)
    prompts = chat_prompts(tokenizer)[:1]
    with pytest.raises(ValueError, match="narrower than k"):
        recommend(model, tokenizer, prompts, catalogue, k=10, num_beams=5)
    with pytest.raises(ValueError, match="exceeds the catalogue"):
        recommend(model, tokenizer, prompts, catalogue, k=20, num_beams=20)
    with pytest.raises(TypeError, match="single string"):
        recommend(model, tokenizer, prompts[0], catalogue, k=2)
    with pytest.raises(ValueError, match="empty"):
        recommend(model, tokenizer, [[]], catalogue, k=2)
    with pytest.raises(ValueError, match="need a tokenizer"):
        recommend(model, None, prompts, catalogue, k=2)


def test_invalid_and_duplicate_beams_are_counted():
    trie = SIDTrie({"x": [10, 20], "y": [10, 21], "z": [11, 20]})
    result = Recommendations(items=[[]], scores=[[]], k=2, num_beams=6)
    beams = torch.tensor([[10, 21], [11, 21], [10, 21], [11, 20], [10, 20], [10, 20]])
    scores = torch.tensor([-1.0, -2.0, -3.0, -4.0, -5.0, -1e9])
    _collect(result, 0, trie, beams, scores)
    assert result.items == [["y", "z"]] and result.scores == [[-1.0, -4.0]]
    assert (result.num_invalid, result.num_duplicate, result.num_filler) == (1, 1, 1)
    assert result.num_beams_returned == 6 and result.invalid_rate == pytest.approx(2 / 5)
    with pytest.raises(FloatingPointError):
        _collect(result, 0, trie, beams, torch.full((6,), float("nan")))


@pytest.mark.slow  # the real SmolLM2-135M: a few seconds on CPU
def test_real_smollm2_wide_beam_equals_exhaustive_ranking(tokenizer, smollm2_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    add_sid_tokens(tokenizer, model, scale=float(model.get_input_embeddings().weight.std()))
    catalogue = make_catalogue(tokenizer, n_items=12)
    model.generation_config.do_sample, model.generation_config.temperature = True, 0.2
    prompts = [f"<|im_start|>user\n{QUESTIONS[0]}<|im_end|>\n<|im_start|>assistant\n"]
    recs = recommend(model, tokenizer, prompts, catalogue, k=10, num_beams=12)
    assert_matches_exhaustive(model, tokenizer, prompts, catalogue, recs, k=10)
