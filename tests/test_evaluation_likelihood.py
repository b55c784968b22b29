"""Target log-likelihoods: equal to an unpadded teacher-forced score, and a proper distribution over items."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.decoding_fixtures import add_sid_tokens, chat_prompts, exhaustive_scores, make_catalogue

from peft_grounded.decoding import SIDTrie
from peft_grounded.evaluation import target_log_likelihood


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_likelihoods_match_teacher_forcing_and_normalise_over_the_trie(tokenizer, tiny_model_factory, arch):
    model = tiny_model_factory(arch=arch, tied=arch == "llama")
    add_sid_tokens(tokenizer, model)
    catalogue = make_catalogue(tokenizer)
    trie = SIDTrie(catalogue)
    prompts = chat_prompts(tokenizer)  # of different lengths
    items = list(catalogue)
    for prompt in prompts:
        # every item for this prompt, in batches of 7 (targets of one length: no padding)
        scores = target_log_likelihood(
            model, tokenizer, [prompt] * len(items), [catalogue[i] for i in items], trie, batch_size=7
        )
        reference = exhaustive_scores(
            model, tokenizer(prompt, add_special_tokens=False)["input_ids"], catalogue
        )
        for item, score in zip(items, scores, strict=True):
            assert score["nll"] == pytest.approx(-reference[item], abs=1e-4)
            assert score["constrained_nll"] <= score["nll"] + 1e-6  # renormalising over a subset
            branching = [len(trie.allowed_tokens(catalogue[item][:j])) for j in range(3)]
            assert score["uniform_nll"] == pytest.approx(sum(map(math.log, branching)))
        # the constrained scores are a distribution over the catalogue's items
        assert math.fsum(math.exp(-s["constrained_nll"]) for s in scores) == pytest.approx(1.0, abs=1e-4)
    # prompts of different lengths in one batch: left padding and position ids must not change a score
    mixed = target_log_likelihood(model, tokenizer, prompts, [catalogue[items[0]]] * 3, trie, batch_size=3)
    alone = [target_log_likelihood(model, tokenizer, [q], [catalogue[items[0]]], trie)[0] for q in prompts]
    for a, b in zip(mixed, alone, strict=True):
        assert a["nll"] == pytest.approx(b["nll"], abs=1e-4)
    model.train()  # the model's mode is restored
    target_log_likelihood(model, tokenizer, prompts[:1], [catalogue[items[0]]], trie)
    assert model.training


def test_likelihood_refuses_targets_outside_the_trie(tokenizer, tiny_model_factory):
    model = tiny_model_factory(arch="llama", tied=True)
    add_sid_tokens(tokenizer, model)
    catalogue = make_catalogue(tokenizer)
    prefix = next(iter(catalogue.values()))[:2]
    with pytest.raises(ValueError, match="not a SID of the trie"):
        target_log_likelihood(model, tokenizer, ["x"], [prefix], SIDTrie(catalogue))
    with pytest.raises(ValueError, match="one target per prompt"):
        target_log_likelihood(model, tokenizer, ["x", "y"], [prefix], SIDTrie(catalogue))
    assert torch.is_grad_enabled()
