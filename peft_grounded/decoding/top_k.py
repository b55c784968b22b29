"""The one route from prompts to each user's top-``k`` list, shared by ``evaluate`` and ``recommend``: the
SID-constrained beam search with the user's own items left out inside it (SIDs of several lengths: dropped
afterwards, with a wider search for a user whose list came up short)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from .generation import Recommendations, recommend
from .heads import SIDSoftmax
from .trie import SIDTrie


def top_k_lists(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str] | Sequence[Sequence[int]],
    trie: SIDTrie,
    *,
    k: int,
    num_beams: int,
    exclude: Sequence[Collection[Any]] | None = None,
    batch_size: int = 16,
    sid_softmax: SIDSoftmax = None,
    targets: Sequence[Sequence[int]] | None = None,
    show_progress: bool = False,
) -> Recommendations:
    """Each prompt's ``k`` best items (fewer only when the trie holds fewer that are not excluded).

    ``num_beams`` beams (at least ``k``, at most the trie's items) are searched; with ``exclude`` (one
    collection of items per prompt, e.g. the user's history) the search never enters those items (SIDs of
    one length: the beams go to the other items), or, for SIDs of several lengths, they are dropped from the
    beams and a prompt left with fewer than ``k`` is searched again with its excluded items' worth of extra
    beams.
    ``sid_softmax`` and ``targets``: as :func:`~.generation.recommend`; the counters and ``extra`` are those
    of the first search."""
    if exclude is not None and len(exclude) != len(prompts):
        raise ValueError(f"{len(exclude)} exclusion sets for {len(prompts)} prompts: give one per prompt")
    beams = min(len(trie), max(num_beams, k))
    inside = exclude is not None and trie.fixed_length  # the search itself leaves them out
    found = recommend(
        model,
        tokenizer,
        prompts,
        trie,
        k=beams,
        num_beams=beams,
        batch_size=batch_size,
        sid_softmax=sid_softmax,
        targets=targets,
        show_progress=show_progress,
        exclude=exclude if inside else None,
    )
    items, scores = found.items, found.scores
    if exclude is not None and not inside:
        items, scores = left_out(items, scores, exclude, k)
        for u in [u for u, row in enumerate(items) if len(row) < k]:
            wide = min(len(trie), beams + sum(i in trie for i in set(exclude[u])))
            if wide <= beams:
                continue
            again = recommend(
                model, tokenizer, [prompts[u]], trie, k=wide, num_beams=wide, sid_softmax=sid_softmax
            )
            (items[u],), (scores[u],) = left_out(again.items, again.scores, [exclude[u]], k)
    found.items = [row[:k] for row in items]
    found.scores = [row[:k] for row in scores]
    found.k = k
    return found


def left_out(
    items: list[list[Any]], scores: list[list[float]], exclude: Sequence[Collection[Any]], k: int
) -> tuple[list[list[Any]], list[list[float]]]:
    """Each row's first ``k`` items (and scores) that its ``exclude`` collection does not hold."""
    kept_items, kept_scores = [], []
    for row, values, seen in zip(items, scores, exclude, strict=True):
        seen = set(seen)
        pairs = [(i, s) for i, s in zip(row, values, strict=True) if i not in seen][:k]
        kept_items.append([i for i, _ in pairs])
        kept_scores.append([s for _, s in pairs])
    return kept_items, kept_scores
