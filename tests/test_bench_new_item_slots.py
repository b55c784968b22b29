"""New-item slots (TIGER's cold-start rule, now a control of the new-item protocol,
``benchmarks/new_item_protocol.py``): prefix matches of the model's picks, a quota, clear errors; random slots,
its control."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.sids_fixtures import ENCODER, growth_vectors, parent_index

from benchmarks.new_item_protocol import mix_new_items, random_slots
from peft_grounded.decoding import Recommendations, SIDTrie, recommend, sid_token_ids
from peft_grounded.new_items.grow_index import add_vectors


@pytest.fixture(scope="module")
def grown():
    parent = parent_index(codes=(8, 8))  # 60 old items, 8 x 8 codes + a disambiguation level
    _, new = growth_vectors()  # 20 new items from the same clusters: many share an old item's semantic codes
    child = add_vectors(parent, [f"new{i}" for i in range(len(new))], new, encoder=ENCODER)
    return parent, child, child.item_ids[parent.n_items :]


def _lists(items: list[list[str]], k: int) -> Recommendations:
    scores = [[-float(r) for r in range(len(row))] for row in items]
    return Recommendations(items=items, scores=scores, k=k, num_beams=max(len(r) for r in items))


def _mates(child, new, item, levels=2):
    """The new items in ``item``'s region, nearest first (the order the rule serves them in)."""
    found = [n for n in new if child.sid_of(n)[:levels] == child.sid_of(item)[:levels] and n != item]

    def point(i):  # the quantised vector: the item's codebook vectors, summed
        return sum(book[c] for book, c in zip(child.codebooks, child.sid_of(i), strict=False))

    return sorted(found, key=lambda n: (np.linalg.norm(point(n) - point(item)), child.sid_of(n)))


def test_new_items_follow_the_item_whose_semantic_codes_they_share(grown):
    parent, child, new = grown
    # old items ranked by how many new items share their (level 0, level 1) region; ones with none
    rich = sorted(parent.item_ids, key=lambda i: -len(_mates(child, new, i)))
    without = [i for i in parent.item_ids if not _mates(child, new, i)]
    first, second = _mates(child, new, rich[0]), None
    second = next(_mates(child, new, i) for i in rich if _mates(child, new, i) != first)
    assert len(first) == 2 and second and without
    ranked = [without[0], rich[0], next(i for i in rich if _mates(child, new, i) == second), *without[1:8]]
    out = mix_new_items(_lists([ranked], k=10), child, new, share=0.3)
    items, scores = out.items[0], out.scores[0]
    assert [i for i in items if i in new] == [*first, second[0]]  # quota int(0.3 * 10) = 3, by match rank
    assert items[:4] == [without[0], rich[0], *first]  # the model's order kept, mates right after their match
    assert len(items) == 10 and len(set(items)) == 10 and out.extra["new_items_per_list"] == [3]
    assert [i for i in items if i not in new] == ranked[: 10 - 3]
    for item, score in zip(items, scores, strict=True):
        if item in new:  # a mate takes the score of the generated item it matched
            match = next(r for r in ranked if item in _mates(child, new, r))
            assert score == -float(ranked.index(match))
    assert np.all(np.diff(scores) <= 0)  # still best first


def test_the_quota_caps_the_models_own_new_items_and_zero_keeps_them_out(grown):
    parent, child, new = grown
    old = [i for i in parent.item_ids if not _mates(child, new, i)]
    lonely = [n for n in new if not _mates(child, new, n)]  # no other new item in their region
    ranked = [lonely[0], old[0], lonely[1], lonely[2], *old[1:8]]  # the model ranked three new items itself
    capped = mix_new_items(_lists([ranked], k=6), child, new, share=0.34)  # quota int(2.04) = 2
    assert capped.items[0] == [lonely[0], old[0], lonely[1], *old[1:4]]
    assert capped.extra["new_items_per_list"] == [2]
    none = mix_new_items(_lists([ranked], k=6), child, new, share=0.0)
    assert none.items[0] == old[:6] and none.extra["new_items_per_list"] == [0]
    wide = mix_new_items(_lists([ranked], k=6), child, new, share=1.0, match_levels=1)
    assert len(wide.items[0]) == 6 and wide.items[0][0] == lonely[0]  # coarser regions: more mates per item
    assert sum(i in new for i in wide.items[0]) > 2


def test_bad_input_is_refused_with_the_fix(grown):
    parent, child, new = grown
    lists = _lists([parent.item_ids[:5]], k=5)
    with pytest.raises(ValueError, match="between 0 and 1"):
        mix_new_items(lists, child, new, share=1.5)
    with pytest.raises(ValueError, match="match_levels=3 must be between 1 and 2"):
        mix_new_items(lists, child, new, share=0.2, match_levels=3)
    with pytest.raises(ValueError, match="pass the grown index"):
        mix_new_items(lists, parent, new, share=0.2)  # the parent does not hold the new items


def test_mixes_the_lists_that_constrained_beam_search_returns(grown, tokenizer, tiny_model_factory):
    _, child, new = grown
    model = tiny_model_factory()
    tokenizer.add_tokens(child.token_strings)
    model.resize_token_embeddings(len(tokenizer))
    trie = SIDTrie(sid_token_ids(tokenizer, child.sid_map()))
    prompts = ["I liked <a_1><b_2><c_0> and", "Recommend something."]
    with torch.no_grad():
        beams = recommend(model, tokenizer, prompts, trie, k=12, num_beams=12)
    mixed = mix_new_items(beams, child, new, share=0.2, k=10)
    assert mixed.k == 10
    fresh = set(new)
    for items, own in zip(mixed.items, beams.items, strict=True):
        n_new = sum(i in fresh for i in items)
        assert n_new <= 2 and len(set(items)) == len(items) and all(i in child for i in items)
        kept = [i for i in own if i not in fresh]  # the model's old items, in its order, fill the rest
        assert [i for i in items if i not in fresh] == kept[: len(items) - n_new]
        # a list is short of k only when the model's own new items beyond the quota were dropped
        assert len(items) == 10 or len(items) == len(kept) + n_new


def test_random_slots_keep_the_models_first_items_and_fill_the_rest_with_new_ones(grown):
    parent, _, new = grown
    ranked = [new[0], *parent.item_ids[:9]]
    lists = random_slots(_lists([ranked], k=10), list(new), share=0.2, k=5, seed=3)
    assert lists[0][:4] == parent.item_ids[:4]  # the model's old items keep k - int(0.2 * 5) = 4 places
    assert len(lists[0]) == 5 and lists[0][4] in new
    assert random_slots(_lists([ranked], k=10), list(new), share=0.2, k=5, seed=3) == lists  # seeded
