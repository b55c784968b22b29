"""How items spread over the SID codes: per-token frequencies and the majority label of each code, read from
a :class:`~peft_grounded.sids.SIDIndex` (the geometry report's code frequencies and category purity)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ..sids.index import SIDIndex


def token_frequencies(
    index: SIDIndex, by: str = "items", counts: Mapping[str, int] | None = None
) -> np.ndarray:
    """Per SID token (row order): how many items carry it (``by="items"``), or how many interactions
    name an item carrying it (``by="interactions"``; ``counts`` maps item id -> count, e.g.
    ``split.training_target_counts()``, and defaults to the build catalogue's interactions)."""
    if by == "items":
        weights = np.ones(index.n_items)
    elif by == "interactions":
        if counts is not None:
            weights = np.array([counts.get(i, 0) for i in index.item_ids], dtype=np.float64)
        elif index.item_interactions is not None:
            weights = index.item_interactions.astype(np.float64)
        else:
            raise ValueError("this index has no interaction counts; pass counts={item_id: count}")
    else:
        raise ValueError(f"by must be 'items' or 'interactions', got {by!r}")
    out = np.concatenate(
        [
            np.bincount(index.codes[:, lv], weights=weights, minlength=k)
            for lv, k in enumerate(index.codes_per_level)
        ]
    )
    return out.astype(np.int64)


def majority_labels(
    index: SIDIndex,
    level: int = 0,
    item_labels: Mapping[str, str] | Sequence[str] | None = None,
    depth: int = 0,
) -> list[tuple[str | None, float]]:
    """For each code of ``level``: the most common label of its items and that label's share.

    ``item_labels`` (per item id, or in ``item_ids`` order) defaults to the category path element at
    ``depth`` stored at build time. Codes no item carries give ``(None, 0.0)``.
    """
    if item_labels is None:
        if index.item_categories is None:
            raise ValueError("this index stores no categories; pass item_labels")
        labels = [c[min(depth, len(c) - 1)] if c else "<none>" for c in index.item_categories]
    elif isinstance(item_labels, Mapping):
        labels = [item_labels.get(i, "<none>") for i in index.item_ids]
    else:
        labels = list(item_labels)
    per_code: list[Counter[str]] = [Counter() for _ in range(index.codes_per_level[level])]
    for code, label in zip(index.codes[:, level].tolist(), labels, strict=True):
        per_code[code][label] += 1
    out: list[tuple[str | None, float]] = []
    for counter in per_code:
        if counter:
            label, n = counter.most_common(1)[0]
            out.append((label, n / sum(counter.values())))
        else:
            out.append((None, 0.0))
    return out


def level0_labels(index: SIDIndex, depth: int = 0) -> list[str | None]:
    """Majority category label of each level-0 token (for neighbourhood-purity diagnostics)."""
    return [label for label, _ in majority_labels(index, 0, depth=depth)]
