"""How new items get their codes in a grown index, and the grown centroids: the disambiguation level's next
free codes, a Hungarian reassignment of the last level, or the nearest codes; running means per token."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..sids.collisions import group_ids
from ..sids.index import SIDIndex


def dedup_mode(index: SIDIndex) -> str:
    if index.disambiguation_level:
        return "level"
    return str(index.build_config.get("dedup") or index.quality.get("dedup") or "none")


def next_disambiguation(
    parent_codes: np.ndarray, new_prefix: np.ndarray, residual_sq: np.ndarray
) -> np.ndarray:
    """Disambiguation codes for the new items: each group's next free codes, best-fitting first."""
    n_old = len(parent_codes)
    prefixes = np.concatenate([parent_codes[:, :-1], new_prefix])
    group, _ = group_ids(prefixes)
    used = np.full(group.max() + 1, -1, dtype=np.int64)
    np.maximum.at(used, group[:n_old], parent_codes[:, -1])
    new_group = group[n_old:]
    order = np.lexsort((np.arange(len(new_group)), residual_sq, new_group))
    out = np.empty(len(new_group), dtype=np.int64)
    sorted_groups = new_group[order]
    starts = np.searchsorted(sorted_groups, sorted_groups, "left")
    out[order] = used[sorted_groups] + 1 + (np.arange(len(order)) - starts)
    return out


def reassign_new(
    parent_codes: np.ndarray, new_codes: np.ndarray, entering: np.ndarray, last_book: np.ndarray
) -> tuple[np.ndarray, int]:
    """Last-level codes for new items: the nearest codes still free within their prefix group."""
    from .._extras import require

    linear_sum_assignment = require("scipy.optimize", "codes for new items (add-items)").linear_sum_assignment

    codes = new_codes.copy()
    k = last_book.shape[0]
    taken: dict[tuple[int, ...], set[int]] = {}
    for row in parent_codes.tolist():
        taken.setdefault(tuple(row[:-1]), set()).add(row[-1])
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, row in enumerate(codes.tolist()):
        groups.setdefault(tuple(row[:-1]), []).append(i)
    cost = (entering**2).sum(1)[:, None] - 2 * entering @ last_book.T + (last_book**2).sum(1)[None, :]
    unresolved = 0
    for prefix, rows in groups.items():
        free = np.array(sorted(set(range(k)) - taken.get(prefix, set())), dtype=np.int64)
        rows_a = np.asarray(rows)
        if len(free) == 0:
            codes[rows_a, -1] = cost[rows_a].argmin(1)
            unresolved += len(rows)
            continue
        sub = cost[np.ix_(rows_a, free)]
        r, c = linear_sum_assignment(sub)
        codes[rows_a[r], -1] = free[c]
        rest = np.setdiff1d(np.arange(len(rows)), r)
        if len(rest):
            codes[rows_a[rest], -1] = cost[rows_a[rest]].argmin(1)
            unresolved += len(rest)
    return codes, unresolved


def _running_means(
    old: np.ndarray, old_counts: np.ndarray, values: np.ndarray, labels: np.ndarray, n_rows: int
) -> np.ndarray:
    """Rows ``old`` (means over ``old_counts`` items, padded to ``n_rows``) updated with ``values`` by label."""
    sums = np.zeros((n_rows, values.shape[1]), dtype=np.float64)
    np.add.at(sums, labels, values.astype(np.float64))
    counts = np.bincount(labels, minlength=n_rows).astype(np.float64)
    before = np.zeros(n_rows, dtype=np.float64)
    before[: len(old_counts)] = old_counts
    out = np.zeros((n_rows, old.shape[1]), dtype=np.float64)
    out[: len(old)] = old
    touched = counts > 0
    total = before[touched] + counts[touched]
    out[touched] = (out[touched] * before[touched, None] + sums[touched]) / total[:, None]
    return out


def grown_centroids(
    index: SIDIndex, codes: np.ndarray, vectors: np.ndarray, residual: np.ndarray, per_level: Sequence[int]
) -> dict[str, np.ndarray]:
    """The centroid variants of the child, rows in the child's token order."""
    out: dict[str, np.ndarray] = {}
    old_offsets = np.cumsum((0, *index.codes_per_level[:-1]))
    n_books = len(index.codebooks)
    for variant, matrix in index.centroids.items():
        rows = []
        for level, k in enumerate(per_level):
            old = matrix[old_offsets[level] : old_offsets[level] + index.codes_per_level[level]]
            if variant == "codebook" and level < n_books:
                rows.append(old.astype(np.float64))  # a k-means codebook: unchanged
                continue
            values = residual if variant == "codebook" else vectors
            counts = np.bincount(index.codes[:, level], minlength=index.codes_per_level[level])
            rows.append(_running_means(old, counts, values, codes[:, level], k))
        out[variant] = np.concatenate(rows).astype(np.float32)
    return out
