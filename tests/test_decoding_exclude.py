"""The user's items left out inside the beam search (issue 42, evaluation speed): the trie closes the
branches that lead only to excluded items, so no beam is spent on them; checked against the exhaustive
ranking with the history dropped, and on a narrow search against the wide search it replaces."""

from __future__ import annotations

import random

import pytest
import torch
from helpers.decoding_fixtures import N_ITEMS, add_sid_tokens, chat_prompts, exhaustive_scores, make_catalogue

from peft_grounded.decoding import SIDTrie, recommend


def test_open_nodes_close_exactly_the_branches_of_excluded_items():
    trie = SIDTrie({"a": [1, 10], "b": [1, 11], "c": [2, 10]})
    root, n1, n2 = 0, int(trie.walk(torch.tensor([[1]]))[0]), int(trie.walk(torch.tensor([[2]]))[0])
    leaf = {
        i: int(trie.walk(torch.tensor([s]))[0]) for i, s in (("a", [1, 10]), ("b", [1, 11]), ("c", [2, 10]))
    }
    open_ = trie.open_nodes([[], ["a"], ["a", "b"], ["a", "b", "c"], ["zzz"]])
    assert open_[0].all() and open_[4].all()  # nothing excluded (an unknown item is ignored)
    assert not open_[1, leaf["a"]] and open_[1, n1] and open_[1, leaf["b"]]
    assert not open_[2, n1] and open_[2, n2] and open_[2, root]  # all of prefix 1 excluded: closed
    assert not open_[3, root] and not open_[3].any()


@pytest.mark.parametrize(("arch", "tied"), [("llama", True), ("qwen3", False)])
def test_a_search_that_never_enters_the_history_ranks_like_the_exhaustive_scores(
    tokenizer, tiny_model_factory, arch, tied
):
    model = tiny_model_factory(arch=arch, tied=tied)
    add_sid_tokens(tokenizer, model)
    catalogue = make_catalogue(tokenizer)
    prompts = chat_prompts(tokenizer)
    rng = random.Random(0)
    items = list(catalogue)
    exclude = [rng.sample(items, 6) for _ in prompts]
    k = 8
    recs = recommend(
        model, tokenizer, prompts, catalogue, k=k, num_beams=N_ITEMS, batch_size=2, exclude=exclude
    )
    for p, prompt in enumerate(prompts):
        scores = exhaustive_scores(model, tokenizer(prompt, add_special_tokens=False)["input_ids"], catalogue)
        ranking = [i for i in sorted(scores, key=lambda i: -scores[i]) if i not in exclude[p]][:k]
        assert recs.items[p] == ranking, f"prompt {p}"
        torch.testing.assert_close(recs.scores[p], [scores[i] for i in ranking], atol=1e-4, rtol=1e-5)


def test_narrow_beams_are_not_spent_on_excluded_items(tokenizer, tiny_model_factory):
    """With as many beams as the list is long, the excluded items take none: every list is full and holds
    no excluded item; the route that drops them afterwards came up short and had to search again."""
    model = tiny_model_factory(arch="llama", tied=True)
    add_sid_tokens(tokenizer, model)
    catalogue = make_catalogue(tokenizer)
    trie = SIDTrie(catalogue)
    prompts = chat_prompts(tokenizer)
    plain = recommend(model, tokenizer, prompts, trie, k=5, num_beams=5)
    exclude = [row[:3] for row in plain.items]  # each prompt's own best three
    inside = recommend(model, tokenizer, prompts, trie, k=5, num_beams=5, exclude=exclude)
    for row, seen in zip(inside.items, exclude, strict=True):
        assert len(row) == 5 and not set(row) & set(seen)


def test_a_prompt_excluding_almost_everything_gets_what_is_left(tokenizer, tiny_model_factory):
    model = tiny_model_factory(arch="llama", tied=True)
    add_sid_tokens(tokenizer, model)
    catalogue = make_catalogue(tokenizer)
    prompts = chat_prompts(tokenizer)[:2]
    items = list(catalogue)
    exclude = [items[:-3], []]  # the first prompt may only get the last three items
    recs = recommend(model, tokenizer, prompts, catalogue, k=5, num_beams=10, exclude=exclude)
    assert sorted(recs.items[0]) == sorted(items[-3:]) and len(recs.items[1]) == 5
    with pytest.raises(ValueError, match="one per prompt"):
        recommend(model, tokenizer, prompts, catalogue, k=5, num_beams=10, exclude=exclude[:1])
