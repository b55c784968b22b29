"""Per-token targets from item-level data: code frequencies and level-0 categories.

Both come out aligned with the SID vocabulary's order (level by level, code by code, as
:func:`peft_grounded.sids.tokens.sid_vocabulary` lists the tokens).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np


def _offsets(codes_per_level: Sequence[int]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(codes_per_level)[:-1]]).astype(np.int64)


def _check_codes(item_codes: Sequence[Sequence[int]], codes_per_level: Sequence[int]) -> None:
    for item, codes in enumerate(item_codes):
        if len(codes) != len(codes_per_level):
            raise ValueError(
                f"item {item} has {len(codes)} codes, the index has {len(codes_per_level)} levels"
            )
        for level, (code, n) in enumerate(zip(codes, codes_per_level, strict=True)):
            if not 0 <= code < n:
                raise ValueError(f"item {item}: code {code} at level {level} is outside [0, {n})")


def code_frequencies(
    item_codes: Sequence[Sequence[int]],
    codes_per_level: Sequence[int],
    counts: Sequence[float] | None = None,
) -> np.ndarray:
    """How often each (level, code) token occurs: the sum over items carrying it of ``counts[item]``.

    ``counts`` is e.g. how many times each item is a training target (default: 1 per item, the
    frequency of the code in the catalogue).
    """
    _check_codes(item_codes, codes_per_level)
    weights = np.ones(len(item_codes)) if counts is None else np.asarray(counts, dtype=np.float64)
    if weights.shape != (len(item_codes),):
        raise ValueError(f"{weights.size} counts for {len(item_codes)} items")
    frequencies = np.zeros(int(sum(codes_per_level)))
    offsets = _offsets(codes_per_level)
    for codes, weight in zip(item_codes, weights, strict=True):
        frequencies[offsets + np.asarray(codes, dtype=np.int64)] += weight
    return frequencies


def level0_categories(
    item_codes: Sequence[Sequence[int]],
    item_categories: Sequence[str | None],
    codes_per_level: Sequence[int],
) -> list[str | None]:
    """Category of every SID token: for a level-0 token, the most common category of its items.

    Items without a category are ignored; ties go to the alphabetically first category. Tokens of
    deeper levels, and level-0 codes without categorised items, get ``None`` (purity skips them).
    """
    _check_codes(item_codes, codes_per_level)
    if len(item_categories) != len(item_codes):
        raise ValueError(f"{len(item_categories)} categories for {len(item_codes)} items")
    votes: dict[int, Counter[str]] = {}
    for codes, category in zip(item_codes, item_categories, strict=True):
        if category:
            votes.setdefault(int(codes[0]), Counter())[category] += 1
    labels: list[str | None] = [None] * int(sum(codes_per_level))
    for code, counter in votes.items():
        labels[code] = min(counter, key=lambda c: (-counter[c], c))
    return labels
