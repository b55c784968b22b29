"""Items that share a SID, and the two ways to give every item its own.

* ``"level"`` (GRID / TIGER style): append one level whose code numbers the items that share the same
  k-means SID, 0, 1, 2, ... in order of increasing final residual (the best-fitting item gets 0, ties by
  catalogue order). Always unique; the extra level has as many codes as the largest collision group.
* ``"reassign"`` (LC-Rec's Sinkhorn-balanced last level, solved exactly): within each group of items
  sharing the first ``L-1`` codes, the last-level codes are re-chosen so that no two items share one,
  minimising the total squared distance (Hungarian algorithm per group). A group larger than the last
  level's ``K`` cannot be separated; its remaining collisions are counted, never hidden.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

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
    from .._extras import require

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
