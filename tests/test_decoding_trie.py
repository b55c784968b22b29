"""The SID prefix trie: structure, batched walks and masks, and the checks that keep decoding 1:1."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from helpers.generate_reference import SIDConstraintLogitsProcessor

from peft_grounded.decoding import SIDTrie
from peft_grounded.decoding.trie import DEAD

# Level l code c -> token id 100 * (l + 1) + c, so ids of different levels never clash.
CATALOGUE = {
    "x": [100, 200, 300],
    "y": [100, 200, 301],  # shares two levels with x
    "z": [100, 201, 300],  # shares the first level with x and y
    "w": [101, 200, 300],
}


def test_allowed_tokens_follow_shared_prefixes():
    trie = SIDTrie(CATALOGUE)
    assert trie.fixed_length and trie.max_length == 3 and len(trie) == 4
    assert trie.allowed_tokens([]) == [100, 101]
    assert trie.allowed_tokens([100]) == [200, 201]
    assert trie.allowed_tokens([100, 200]) == [300, 301]
    assert trie.allowed_tokens([101, 200]) == [300]
    assert trie.allowed_tokens([101, 201]) == []  # not a prefix
    assert trie.allowed_tokens([100, 200, 300]) == []  # complete, fixed length: nothing follows
    assert trie.num_nodes == 1 + 2 + 3 + 4
    assert [trie.item_of(s) for s in CATALOGUE.values()] == list(CATALOGUE)
    assert trie.item_of([100, 200]) is None
    assert "x" in trie and "nope" not in trie


def test_batched_mask_equals_per_prefix_lookup():
    rng = random.Random(0)
    codes = rng.sample(list(itertools.product(range(5), repeat=3)), 60)
    catalogue = {i: [10 + c0, 20 + c1, 30 + c2] for i, (c0, c1, c2) in enumerate(codes)}
    trie = SIDTrie(catalogue)
    prefixes = [sid[:depth] for sid in catalogue.values() for depth in range(3)]
    prefixes += [[12, 99], [35], [10, 20, 30, 40]]  # off-trie rows
    for depth in range(4):
        rows = [p for p in prefixes if len(p) == depth]
        if not rows:
            continue
        nodes = trie.walk(torch.tensor(rows))
        mask = trie.allowed_mask(nodes, vocab_size=64)
        for row, prefix in enumerate(rows):
            expected = set(trie.allowed_tokens(prefix))
            assert set(mask[row].nonzero().flatten().tolist()) == expected
            if not expected:
                assert nodes[row] == DEAD or bool(trie.is_complete(nodes[row : row + 1]))


def test_variable_lengths_end_with_the_end_token():
    catalogue = {"short": [100, 200], "long1": [101, 200, 300], "long2": [101, 200, 301]}
    with pytest.raises(ValueError, match="end_token_id"):
        SIDTrie(catalogue)
    trie = SIDTrie(catalogue, end_token_id=7)
    assert not trie.fixed_length and trie.lengths == [2, 3]
    assert trie.allowed_tokens([100, 200]) == [7]
    assert trie.allowed_tokens([101, 200]) == [300, 301]
    # The processor: at a complete SID only the end token survives, with score 0.
    processor = SIDConstraintLogitsProcessor(trie, prompt_length=1)
    input_ids = torch.tensor([[5, 100, 200], [5, 101, 200]])
    scores = torch.log_softmax(torch.randn(2, 400), dim=-1)
    out = processor(input_ids, scores)
    assert out[0, 7] == 0 and torch.isinf(out[0]).sum() == 399
    assert set(torch.isfinite(out[1]).nonzero().flatten().tolist()) == {300, 301}
    assert torch.equal(out[1, [300, 301]], scores[1, [300, 301]])  # log-probs kept, not renormalised


def test_processor_keeps_log_probs_of_allowed_tokens_only():
    trie = SIDTrie(CATALOGUE)
    processor = SIDConstraintLogitsProcessor(trie, prompt_length=2)
    input_ids = torch.tensor([[1, 2, 100], [3, 4, 100], [1, 2, 999]])
    scores = torch.log_softmax(torch.randn(3, 500), dim=-1)
    out = processor(input_ids, scores)
    for row, allowed in enumerate([{200, 201}, {200, 201}, set()]):
        finite = set(torch.isfinite(out[row]).nonzero().flatten().tolist())
        assert finite == allowed
        for token in allowed:
            assert out[row, token] == scores[row, token]


@pytest.mark.parametrize(
    ("catalogue", "kwargs", "match"),
    [
        ({}, {}, "non-empty"),
        ({"a": [1, 2], "b": [1, 2]}, {}, "share the SID"),
        ({"a": [1, 2], "b": [1, 2, 3]}, {"end_token_id": 9}, "proper prefixes"),
        ({"a": []}, {}, "empty SID"),
        ({"a": [1, -2]}, {}, "negative"),
        ({"a": [1, 2], "b": [3, 4, 5]}, {"end_token_id": 2}, "also a SID token"),
    ],
)
def test_bad_catalogues_are_refused(catalogue, kwargs, match):
    with pytest.raises(ValueError, match=match):
        SIDTrie(catalogue, **kwargs)


def test_string_sids_point_to_the_converter():
    with pytest.raises(TypeError, match="sid_token_ids"):
        SIDTrie({"a": "<a_1><b_2>"})


def test_token_ids_beyond_the_model_vocabulary_are_refused():
    trie = SIDTrie(CATALOGUE)
    processor = SIDConstraintLogitsProcessor(trie, prompt_length=1)
    with pytest.raises(ValueError, match="resize the model"):
        processor(torch.tensor([[1]]), torch.zeros(1, 250))
