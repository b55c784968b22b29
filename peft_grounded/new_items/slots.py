"""New items in the top-K at once: slots for items that share a SID prefix with the model's picks.

A model trained before an item existed has never seen its SID as a target, so beam search rarely reaches
it, even when the item's first codes (its semantic region) are ones the model ranks highly. TIGER's
cold-start rule (Rajput et al., 2023) serves such items anyway: a new item whose SID shares its first
``match_levels`` codes with an item the model generated takes that item's score, and at most
``share * k`` of the ``k`` slots go to new items. No training and no extra forward pass: it reads the
beams the search already returned.

The served new-item rule is :class:`~.rule.NewItemRule` (what ``evaluate`` and ``recommend`` serve); the slot
rule is one of the new-item protocol's controls (``benchmarks/bench_grow_protocol.py``), beside
:func:`random_slots`, the control of any new-item rule.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Iterable
from dataclasses import replace
from typing import Any

import numpy as np

from ..decoding import Recommendations


def default_match_levels(index: Any) -> int:
    """Every level but the last: the semantic codes when the last level is the disambiguation code."""
    return max(index.n_levels - 1, 1)


def quantised_vector(index: Any, item: str) -> np.ndarray:
    """The item's point in the quantiser's space: the sum of its codebook vectors (the k-means levels)."""
    codes = index.sid_of(item)
    codes = codes[: len(index.codebooks)]  # the disambiguation code has no codebook
    return sum(
        np.asarray(book[code], dtype=np.float64) for book, code in zip(index.codebooks, codes, strict=True)
    )


def nearest_first(index: Any, item: str, candidates: list[str]) -> list[str]:
    """``candidates`` ordered by the distance of their quantised vectors to ``item``'s (ties: given order)."""
    if len(candidates) < 2:
        return candidates
    anchor = quantised_vector(index, item)
    distance = {c: float(np.linalg.norm(quantised_vector(index, c) - anchor)) for c in candidates}
    return sorted(candidates, key=distance.__getitem__)


def mix_new_items(
    recommendations: Recommendations,
    index: Any,
    new_items: Iterable[Hashable],
    *,
    share: float,
    match_levels: int | None = None,
    k: int | None = None,
) -> Recommendations:
    """Top-``k`` lists in which up to ``floor(share * k)`` slots go to new items near the model's picks.

    Walking each list best first, every item keeps its place and is followed by the new items whose SID
    starts with the same ``match_levels`` codes (nearest first: by the distance of their quantised
    vectors, the sums of their codebook vectors), each with the score of the item it matched, until the
    new-item quota is spent; new items the model ranked itself count towards the quota (beyond it they
    are dropped). ``share=0`` keeps the model's new items out entirely.

    Args:
        recommendations: the model's lists (e.g. from :func:`~peft_grounded.decoding.recommend` with ``num_beams``
            above ``k``, so that there are more generated items to match and to fill with).
        index: the (grown) :class:`~peft_grounded.sids.SIDIndex` holding old and new items.
        new_items: the items added since the model was trained (``child.added_items()``).
        share: the most new items a list may hold, as a fraction of ``k`` (0 to 1).
        match_levels: leading codes a new item must share with a generated item (default: all levels
            but the last).
        k: list length (default ``recommendations.k``).

    Returns:
        New :class:`Recommendations`; ``extra["new_items_per_list"]`` counts the new items in each list.
    """
    k = recommendations.k if k is None else k
    levels = default_match_levels(index) if match_levels is None else match_levels
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"share must be a fraction of k between 0 and 1, got {share}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not 1 <= levels <= index.n_levels - 1:
        raise ValueError(
            f"match_levels={levels} must be between 1 and {index.n_levels - 1} (the index has {index.n_levels} "
            "levels; matching all of them would only match the same SID)"
        )
    new = {str(item) for item in new_items}
    missing = sorted(item for item in new if item not in index)
    if missing:
        raise ValueError(
            f"{len(missing)} new items are not in the SID index (e.g. {missing[:3]}): pass the grown index "
            "(SIDIndex.add_items) that holds them"
        )
    quota = int(share * k + 1e-9)
    regions: dict[tuple[int, ...], list[str]] = {}  # prefix -> the new items under it
    # generated item -> its region's new items, nearest first (computed once per call)
    mates: dict[str, list[str]] = {}
    items_out: list[list[Hashable]] = []
    scores_out: list[list[float]] = []
    counts: list[int] = []
    for items, scores in zip(recommendations.items, recommendations.scores, strict=True):
        chosen: list[Hashable] = []
        chosen_scores: list[float] = []
        taken: set[str] = set()
        n_new = 0
        for item, score in zip(items, scores, strict=True):
            if len(chosen) == k:
                break
            key = str(item)
            if key in taken:
                continue
            if key in new:
                if n_new == quota:
                    continue
                n_new += 1
            chosen.append(item)
            chosen_scores.append(score)
            taken.add(key)
            if key not in mates:
                prefix = index.sid_of(key)[:levels]
                if prefix not in regions:
                    regions[prefix] = [i for i in index.items_with_prefix(prefix) if i in new]
                mates[key] = nearest_first(index, key, regions[prefix])
            for mate in mates[key]:
                if len(chosen) == k or n_new == quota:
                    break
                if mate not in taken:
                    chosen.append(mate)
                    chosen_scores.append(score)
                    taken.add(mate)
                    n_new += 1
        items_out.append(chosen)
        scores_out.append(chosen_scores)
        counts.append(n_new)
    extra = dict(recommendations.extra) | {"new_items_per_list": counts}
    return replace(recommendations, items=items_out, scores=scores_out, k=k, extra=extra)


def random_slots(
    recommendations: Recommendations, new_items: list[str], share: float, k: int, seed: int
) -> list[list[str]]:
    """The control for any new-item rule: the model's first ``k - floor(share * k)`` items, then random new
    items (seeded, history-blind) in the remaining slots."""
    rng = random.Random(seed)
    quota = int(share * k + 1e-9)
    new = set(new_items)
    lists = []
    for items in recommendations.items:
        kept = [i for i in items if i not in new][: k - quota]
        fill = [i for i in rng.sample(new_items, min(len(new_items), quota + k)) if i not in kept]
        lists.append(kept + fill[: k - len(kept)])
    return lists
