"""Items that share a SID, and the two ways to give every item its own.

* ``"level"`` (GRID / TIGER style): append one level whose code numbers the items that share the same
  k-means SID, 0, 1, 2, ... in order of increasing final residual (the best-fitting item gets 0, ties by
  catalogue order). Always unique; the extra level has as many codes as the largest collision group.
* ``"reassign"`` (LC-Rec's Sinkhorn-balanced last level, solved exactly): within each group of items
  sharing the first ``L-1`` codes, the last-level codes are re-chosen so that no two items share one,
  minimising the total squared distance (Hungarian algorithm per group). A group larger than the last
  level's ``K`` cannot be separated; its remaining collisions are counted, never hidden.

The quality figures of a set of SIDs (codebook use and entropy per level, collisions, quantisation error:
:func:`level_usage`, :func:`format_quality`) are below.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

DEDUP_MODES = ("level", "reassign", "none")


@dataclass(frozen=True)
class CollisionStats:
    n_items: int
    n_unique: int
    colliding_items: int  # items that share their SID with at least one other item
    max_group: int  # the most items on one SID

    @property
    def collision_rate(self) -> float:
        """``1 - unique SIDs / items`` (0 when every item has its own SID)."""
        return 1.0 - self.n_unique / self.n_items if self.n_items else 0.0

    def as_dict(self) -> dict[str, float | int]:
        return {
            "unique_sids": self.n_unique,
            "collision_rate": round(self.collision_rate, 6),
            "colliding_items": self.colliding_items,
            "max_items_per_sid": self.max_group,
        }


def group_ids(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(inverse, counts)``: the group of each row (rows with equal codes share one) and each group's size."""
    _, inverse, counts = np.unique(codes, axis=0, return_inverse=True, return_counts=True)
    return inverse.reshape(-1), counts


def collision_stats(codes: np.ndarray) -> CollisionStats:
    _, counts = group_ids(codes)
    return CollisionStats(
        n_items=int(codes.shape[0]),
        n_unique=len(counts),
        colliding_items=int(counts[counts > 1].sum()),
        max_group=int(counts.max()) if len(counts) else 0,
    )


def add_disambiguation_level(codes: np.ndarray, residual_sq: np.ndarray) -> np.ndarray:
    """``codes`` with one more column numbering the items of each collision group (see module doc)."""
    inverse, counts = group_ids(codes)
    order = np.lexsort((np.arange(len(inverse)), residual_sq, inverse))
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank = np.empty(len(inverse), dtype=np.int64)
    rank[order] = np.arange(len(inverse)) - starts[inverse[order]]
    return np.concatenate([codes, rank[:, None]], axis=1)


def reassign_last_level(
    codes: np.ndarray, last_residual: np.ndarray, last_codebook: np.ndarray
) -> tuple[np.ndarray, int]:
    """Re-choose last-level codes so that items sharing the first ``L-1`` codes get distinct last codes.

    ``last_residual``: each item's residual entering the last level ``[n, d]``; ``last_codebook``:
    ``[K, d]``. Returns the new codes and the number of items left colliding (groups larger than ``K``).
    """
    from .._imports import require

    linear_sum_assignment = require("scipy.optimize", "dedup='reassign' (build-sids)").linear_sum_assignment

    codes = codes.copy()
    k = last_codebook.shape[0]
    if codes.shape[1] > 1:
        prefix_group, _ = group_ids(codes[:, :-1])
    else:
        prefix_group = np.zeros(codes.shape[0], dtype=np.int64)
    full_group, full_counts = group_ids(codes)
    colliding_prefixes = np.unique(prefix_group[full_counts[full_group] > 1])
    if len(colliding_prefixes) == 0:
        return codes, 0
    book_sq = (last_codebook**2).sum(1)
    order = np.argsort(prefix_group, kind="stable")
    bounds = np.searchsorted(prefix_group[order], colliding_prefixes, side="left")
    ends = np.searchsorted(prefix_group[order], colliding_prefixes, side="right")
    unresolved = 0
    for lo, hi in zip(bounds, ends, strict=True):
        rows = order[lo:hi]
        r = last_residual[rows]
        cost = (r**2).sum(1)[:, None] - 2 * r @ last_codebook.T + book_sq[None, :]
        if len(rows) <= k:
            row_ind, col_ind = linear_sum_assignment(cost)
            codes[rows[row_ind], -1] = col_ind
        else:  # more items than codes: place the K best-fitting optimally, the rest keep their nearest code
            keep = rows[np.argsort(cost.min(1), kind="stable")]
            head = np.isin(rows, keep[:k])
            row_ind, col_ind = linear_sum_assignment(cost[head])
            codes[rows[head][row_ind], -1] = col_ind
            codes[rows[~head], -1] = cost[~head].argmin(1)
            unresolved += len(rows) - k
    if unresolved:
        logger.warning(
            "%d items still share a SID: some prefix groups hold more items than the last level's %d codes; "
            "use dedup='level' or more codes",
            unresolved,
            k,
        )
    return codes, unresolved


# Quality figures of a set of SIDs: codebook use and entropy per level, collisions, quantisation error.


def level_usage(codes: np.ndarray, k: int) -> dict[str, Any]:
    """Use of one level's ``k`` codes by the items' ``codes`` (1-D)."""
    counts = np.bincount(codes, minlength=k)
    used = counts[counts > 0]
    p = used / used.sum() if used.size else used
    entropy = float(-(p * np.log2(p)).sum()) if used.size else 0.0
    return {
        "codes": int(k),
        "used": int(used.size),
        "usage": round(used.size / k, 6),
        "entropy_bits": round(entropy, 6),
        "normalized_entropy": round(entropy / math.log2(k), 6) if k > 1 else 1.0,
        "perplexity": round(2.0**entropy, 3),
        "min_items": int(used.min()) if used.size else 0,
        "max_items": int(counts.max()) if counts.size else 0,
    }


def format_quality(quality: dict[str, Any]) -> str:
    """A plain-text table of the figures :func:`~peft_grounded.sids.build.build_sids` stores."""
    lines = ["level  codes  used   usage  entropy(bits)  norm.entropy  max items/code"]
    for lv in quality["levels"]:
        tag = f"{lv['level']}{'*' if lv.get('disambiguation') else ''}"
        lines.append(
            f"{tag:<6} {lv['codes']:>5} {lv['used']:>5} {lv['usage']:>7.1%} {lv['entropy_bits']:>14.3f} "
            f"{lv['normalized_entropy']:>13.3f} {lv['max_items']:>15}"
        )
    before, after = quality["collisions_before"], quality["collisions_after"]
    lines += [
        f"items: {quality['n_items']}; unique SIDs before handling: {before['unique_sids']} "
        f"(collision rate {before['collision_rate']:.2%}, at most {before['max_items_per_sid']} items on one SID)",
        f"after handling ({quality['dedup']}): {after['unique_sids']} unique "
        f"(collision rate {after['collision_rate']:.2%})",
        f"quantisation error: mse {quality['mse']:.5f}, relative {quality['relative_error']:.2%} "
        f"(per level: {', '.join(f'{e:.2%}' for e in quality['relative_error_per_level'])})",
    ]
    if any(lv.get("disambiguation") for lv in quality["levels"]):
        lines.append("* disambiguation level")
    return "\n".join(lines)
