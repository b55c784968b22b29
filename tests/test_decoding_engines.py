"""The package's constrained beam search (the one engine it serves with) equals transformers' ``generate``
path (the reference in ``helpers/generate_reference.py``), and failures are not silent."""

from __future__ import annotations

import pytest
import torch
from helpers.decoding_fixtures import add_sid_tokens, chat_prompts, make_catalogue
from helpers.generate_reference import _prompt_cache, generate_recommend

from peft_grounded.decoding import SIDTrie, recommend

MORE = [f"I liked <a_{i % 4}><b_{(3 * i) % 4}><c_{(i + 1) % 4}>, then item number {i}." for i in range(9)]


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("beams", [5, 12])
def test_fast_engine_ranks_like_generate(tokenizer, tiny_model_factory, arch, beams):
    model = tiny_model_factory(arch=arch, tied=arch == "llama")
    add_sid_tokens(tokenizer, model)
    catalogue = make_catalogue(tokenizer)
    trie = SIDTrie(catalogue)
    prompts = chat_prompts(tokenizer) + chat_prompts(tokenizer, MORE)  # different lengths: left padding
    k = min(beams, 10)
    old = generate_recommend(model, tokenizer, prompts, trie, k=k, num_beams=beams, batch_size=4)
    new = recommend(model, tokenizer, prompts, trie, k=k, num_beams=beams, batch_size=4)
    assert new.items == old.items
    for a, b in zip(new.scores, old.scores, strict=True):
        assert a == pytest.approx(b, abs=1e-4)
    assert new.num_invalid == new.num_duplicate == 0
    # batching does not change the fast engine's result
    alone = recommend(model, tokenizer, prompts, trie, k=k, num_beams=beams, batch_size=1)
    assert alone.items == new.items


def test_fast_engine_pads_when_fewer_first_tokens_than_beams(tokenizer, tiny_model_factory):
    model = tiny_model_factory(arch="llama", tied=True)
    add_sid_tokens(tokenizer, model)
    small = dict(list(make_catalogue(tokenizer).items())[:6])
    trie = SIDTrie(small)
    prompts = chat_prompts(tokenizer)
    old = generate_recommend(model, tokenizer, prompts, trie, k=6, num_beams=8)
    new = recommend(model, tokenizer, prompts, trie, k=6, num_beams=8)
    assert new.items == old.items and new.num_filler > 0
    # one-token prompts (no cache before the last token), alone and next to a longer one
    for ids in ([[5]], [[5], [7, 8, 9]]):
        fast = recommend(model, tokenizer, ids, trie, k=5, num_beams=6)
        assert fast.items == generate_recommend(model, tokenizer, ids, trie, k=5, num_beams=6).items


def test_sids_of_several_lengths_are_refused(tokenizer, tiny_model_factory):
    model = tiny_model_factory(arch="llama", tied=True)
    add_sid_tokens(tokenizer, model)
    catalogue = make_catalogue(tokenizer)
    uneven = dict(catalogue) | {"short": [*catalogue[next(iter(catalogue))][:1], tokenizer.eos_token_id - 1]}
    uneven = {k: v for k, v in uneven.items() if k == "short" or v[0] != uneven["short"][0]}
    trie = SIDTrie(uneven, end_token_id=tokenizer.eos_token_id)
    with pytest.raises(ValueError, match="one length"):
        recommend(model, tokenizer, ["x"], trie, k=2)


class _NoLogitsToKeep(torch.nn.Module):
    """A causal LM whose forward lacks ``logits_to_keep``: the prefix cache cannot be used."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.config = inner.config
        self.generation_config = inner.generation_config

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, use_cache=None, **kwargs):
        if "logits_to_keep" in kwargs:
            raise TypeError("forward() got an unexpected keyword argument 'logits_to_keep'")
        return self.inner(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=use_cache,
            **kwargs,
        )

    def get_input_embeddings(self):
        return self.inner.get_input_embeddings()


def test_a_forward_type_error_is_named_not_silent(tokenizer, tiny_model_factory):
    model = tiny_model_factory(arch="llama", tied=True)
    add_sid_tokens(tokenizer, model)
    trie = SIDTrie(make_catalogue(tokenizer))
    wrapped = _NoLogitsToKeep(model)
    with pytest.raises(TypeError, match=r"logits_to_keep \(a transformers causal LM"):
        recommend(wrapped, tokenizer, chat_prompts(tokenizer), trie, k=3)
    ids = torch.tensor([[1, 2, 3]])
    with pytest.warns(RuntimeWarning, match=r"prefix cache disabled.*logits_to_keep"):
        assert _prompt_cache(wrapped, ids, torch.ones_like(ids), 2) == {}


def test_fast_engine_scores_targets_from_the_prompt_cache(tokenizer, tiny_model_factory):
    from peft_grounded.evaluation import target_log_likelihood

    model = tiny_model_factory(arch="qwen3", tied=False)
    add_sid_tokens(tokenizer, model)
    catalogue = make_catalogue(tokenizer)
    trie = SIDTrie(catalogue)
    prompts = chat_prompts(tokenizer) + chat_prompts(tokenizer, MORE[:3])
    targets = [catalogue[item] for item in list(catalogue)[: len(prompts)]]
    recs = recommend(model, tokenizer, prompts, trie, k=5, num_beams=8, batch_size=4, targets=targets)
    plain = recommend(model, tokenizer, prompts, trie, k=5, num_beams=8, batch_size=4)
    assert recs.items == plain.items  # scoring the targets leaves the cache as it was
    reference = target_log_likelihood(model, tokenizer, prompts, targets, trie)
    for got, want in zip(recs.extra["target_nlls"], reference, strict=True):
        assert got == pytest.approx(want, abs=1e-4)
    with pytest.raises(ValueError, match="one target per prompt"):
        recommend(model, tokenizer, prompts, trie, k=5, targets=targets[:2])
    with pytest.raises(ValueError, match="not a SID of the trie"):
        recommend(model, tokenizer, prompts[:1], trie, k=5, targets=[targets[0][:2]])


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("shared_prompt", [True, False])
def test_shared_prompt_and_repeated_cache_steps_agree(
    tokenizer, tiny_model_factory, attention, shared_prompt
):
    from peft_grounded.decoding.beam import constrained_beam_search
    from peft_grounded.decoding.search import left_pad

    model = tiny_model_factory(arch="qwen3", tied=True)
    model.config._attn_implementation = attention
    add_sid_tokens(tokenizer, model)
    trie = SIDTrie(make_catalogue(tokenizer))
    prompts = chat_prompts(tokenizer) + chat_prompts(tokenizer, MORE[:2])
    ids, mask = left_pad([tokenizer(p)["input_ids"] for p in prompts], 2, torch.device("cpu"))
    tokens, scores, _ = constrained_beam_search(model, ids, mask, trie, 7, shared_prompt=shared_prompt)
    model.config._attn_implementation = "sdpa"
    old = generate_recommend(model, tokenizer, prompts, trie, k=7, num_beams=7)
    for row, items in enumerate(old.items):
        order = scores[row].argsort(descending=True).tolist()
        assert [trie.item_of(tokens[row, b].tolist()) for b in order] == items


@pytest.mark.parametrize("arch, tied", [("llama", True), ("qwen3", False)])
def test_the_whole_head_scores_the_last_positions_from_a_contiguous_copy(tiny_model_factory, arch, tied):
    """StepHead's whole-vocabulary path passes the kept positions as indices (a contiguous gather, never a
    strided slice into the head: BENCHMARKS, "Serving against the machine's limit"), with the logits of
    ``logits_to_keep`` as an int."""
    from peft_grounded.decoding.heads import StepHead, kept_positions

    model = tiny_model_factory(arch, tied).eval()
    ids = torch.randint(3, 200, (3, 7), generator=torch.Generator().manual_seed(0))
    seen = []
    model.get_output_embeddings().register_forward_hook(
        lambda m, args, out: seen.append(args[0].is_contiguous())
    )
    for keep in (1, 3, 0, 7):
        with torch.no_grad():
            logits, _ = StepHead(model)(model, keep, input_ids=ids)
            expected = model(input_ids=ids, logits_to_keep=keep).logits.float()
        torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    assert seen[0::2] == [True] * 4  # StepHead's calls (the int slices of the reference are not)
    assert kept_positions({"input_ids": ids}, 2).tolist() == [5, 6]
    assert kept_positions({"input_ids": ids}, 0) == 0 and kept_positions({"input_ids": ids}, 9) == 9
    assert kept_positions({}, 1) == 1  # no input_ids (embeddings given): the int, as before
