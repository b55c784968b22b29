"""Decoding under the SID-only softmax: a model whose adapter records it is decoded and scored over its SID
rows only (the package's engine and the generate reference, exhaustive reference); without the record nothing changes."""

from __future__ import annotations

import pytest
import torch
from helpers.decoding_fixtures import N_ITEMS, add_sid_tokens, chat_prompts, exhaustive_scores, make_catalogue
from helpers.generate_reference import generate_recommend
from peft import get_peft_model

from peft_grounded import GroundedTokenConfig
from peft_grounded.decoding import SIDTrie, recommend
from peft_grounded.decoding.heads import StepHead
from peft_grounded.evaluation import target_log_likelihood
from peft_grounded.training.sft.recommendation_trainer import record_sid_softmax


def grounded(tokenizer, factory, arch, tied, sid_softmax=True):
    base = factory(arch=arch, tied=tied, extra_rows=64 if arch == "qwen3" else 0)
    ids = add_sid_tokens(tokenizer, base)
    model = get_peft_model(
        base, GroundedTokenConfig(token_indices=ids, init="gaussian", task_type="CAUSAL_LM")
    )
    with torch.no_grad():  # rows that rank items clearly
        layer = model.get_input_embeddings()
        generator = torch.Generator().manual_seed(3)
        for rows in [*layer.grounded_embedding.values(), *layer.grounded_head.values()]:
            rows.copy_(torch.randn(rows.shape, generator=generator))
    record_sid_softmax(model, sid_softmax)
    model.eval()
    return model, sorted(ids)


@torch.no_grad()
def sid_scores(model, prompt_ids, catalogue, sid_ids) -> dict[str, float]:
    """Teacher-forced log P(SID | prompt), every step normalised over the SID rows only."""
    items = list(catalogue)
    rows = torch.tensor([prompt_ids + catalogue[i] for i in items])
    keep = len(catalogue[items[0]]) + 1
    logits = model(input_ids=rows, logits_to_keep=keep).logits.float()[:, :-1]
    log_probs = logits[..., sid_ids].log_softmax(-1)
    column = {t: c for c, t in enumerate(sid_ids)}
    return {
        item: sum(float(log_probs[r, j, column[t]]) for j, t in enumerate(catalogue[item]))
        for r, item in enumerate(items)
    }


@pytest.mark.parametrize(
    ("arch", "tied"), [("llama", True), ("llama", False), ("qwen3", True), ("qwen3", False)]
)
def test_both_engines_rank_by_the_sid_only_softmax(tokenizer, tiny_model_factory, arch, tied):
    model, sid_ids = grounded(tokenizer, tiny_model_factory, arch, tied)
    catalogue = make_catalogue(tokenizer)
    prompts = chat_prompts(tokenizer)
    fast = recommend(model, tokenizer, prompts, catalogue, k=20, num_beams=N_ITEMS, batch_size=2)
    slow = generate_recommend(model, tokenizer, prompts, catalogue, k=20, num_beams=N_ITEMS)
    for p, prompt in enumerate(prompts):
        scores = sid_scores(
            model, tokenizer(prompt, add_special_tokens=False)["input_ids"], catalogue, sid_ids
        )
        ranking = sorted(scores, key=lambda item: -scores[item])[:20]
        assert fast.items[p] == ranking == slow.items[p], f"prompt {p}"
        torch.testing.assert_close(fast.scores[p], [scores[i] for i in ranking], atol=1e-4, rtol=1e-5)
        torch.testing.assert_close(slow.scores[p], [scores[i] for i in ranking], atol=1e-4, rtol=1e-5)
    full = recommend(model, tokenizer, prompts, catalogue, k=20, num_beams=N_ITEMS, sid_softmax=False)
    for p, prompt in enumerate(prompts):  # asked for the full head: today's ranking
        scores = exhaustive_scores(model, tokenizer(prompt, add_special_tokens=False)["input_ids"], catalogue)
        assert full.items[p] == sorted(scores, key=lambda item: -scores[item])[:20]


def test_the_likelihoods_follow_the_recorded_softmax(tokenizer, tiny_model_factory):
    model, sid_ids = grounded(tokenizer, tiny_model_factory, "llama", False)
    catalogue = make_catalogue(tokenizer)
    prompts = chat_prompts(tokenizer)
    items = list(catalogue)[:3]
    targets = [catalogue[i] for i in items]
    trie = SIDTrie(catalogue)
    scored = recommend(model, tokenizer, prompts, trie, k=5, targets=targets).extra["target_nlls"]
    direct = target_log_likelihood(model, tokenizer, prompts, targets, trie)
    full = target_log_likelihood(model, tokenizer, prompts, targets, trie, sid_softmax=False)
    for p, prompt in enumerate(prompts):
        expected = -sid_scores(
            model, tokenizer(prompt, add_special_tokens=False)["input_ids"], catalogue, sid_ids
        )[items[p]]
        for got in (scored[p], direct[p]):
            assert got["nll"] == pytest.approx(expected, rel=1e-4)
            assert got["constrained_nll"] == pytest.approx(full[p]["constrained_nll"], rel=1e-4)  # same trie
        assert full[p]["nll"] > direct[p]["nll"]  # the whole vocabulary holds more competitors


def test_only_the_sid_rows_are_computed(tokenizer, tiny_model_factory):
    model, sid_ids = grounded(tokenizer, tiny_model_factory, "qwen3", False)
    head = StepHead.for_model(model)
    assert head.width == len(sid_ids) == 12
    ids = torch.tensor([[1, 5, sid_ids[0]]])
    logits, _ = head(model, 1, input_ids=ids)
    reference = model(input_ids=ids, logits_to_keep=1).logits[..., sid_ids]
    torch.testing.assert_close(logits, reference.float(), rtol=1e-5, atol=1e-5)
    assert StepHead.for_model(model, sid_softmax=False).width is None


def test_without_a_record_the_full_head_decodes(tokenizer, tiny_model_factory):
    model, _ = grounded(tokenizer, tiny_model_factory, "llama", True, sid_softmax=False)
    assert StepHead.for_model(model).width is None
    plain = tiny_model_factory("llama", True)
    with pytest.raises(ValueError, match="has none"):
        StepHead.for_model(plain, sid_softmax=True)


def test_a_catalogue_token_outside_the_sid_rows_is_refused(tokenizer, tiny_model_factory):
    model, sid_ids = grounded(tokenizer, tiny_model_factory, "llama", True)
    catalogue = {"a": [sid_ids[0], sid_ids[4], 300], "b": [sid_ids[1], sid_ids[5], sid_ids[9]]}
    with pytest.raises(ValueError, match="not among the adapter's SID rows"):
        recommend(model, tokenizer, chat_prompts(tokenizer)[:1], catalogue, k=1)
