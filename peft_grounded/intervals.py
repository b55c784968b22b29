"""Paired bootstrap intervals: the uncertainty every comparison of this package reports.

A difference between two recommenders is measured per user (on the same users); its interval resamples the
users, within each training seed when several seeds are pooled. Evaluation reports, the new-item rule's
choice and the protocols' tables all draw their intervals here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

RESAMPLES = 10_000
_CHUNK = 4_000_000  # resample x user entries drawn at once (32 MB of int64)


def bootstrap_interval(
    differences: Sequence[Sequence[float] | np.ndarray],
    *,
    resamples: int = RESAMPLES,
    level: float = 0.95,
    seed: int = 0,
) -> dict[str, Any]:
    """Percentile interval of the mean paired difference, pooled over groups (seeds).

    ``differences``: one array of per-user differences per seed. Users are resampled within each seed.
    Returns ``{"difference", "low", "high", "holds_zero", "users", "seeds", "resamples", "level"}``.
    """
    groups = [np.asarray(d, dtype=np.float64).ravel() for d in differences]
    groups = [g for g in groups if g.size]
    if not groups:
        raise ValueError("no paired users to compare")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    total = sum(g.size for g in groups)
    rng = np.random.default_rng(seed)
    sums = np.zeros(resamples)
    for group in groups:
        step = max(1, _CHUNK // group.size)
        for start in range(0, resamples, step):
            stop = min(start + step, resamples)
            idx = rng.integers(0, group.size, size=(stop - start, group.size))
            sums[start:stop] += group[idx].sum(axis=1)
    stats = sums / total
    alpha = (1 - level) / 2
    low, high = np.quantile(stats, [alpha, 1 - alpha])
    observed = math.fsum(float(x) for g in groups for x in g) / total
    low, high = min(float(low), observed), max(float(high), observed)  # guard fp rounding at constants
    return {
        "difference": observed,
        "low": low,
        "high": high,
        "holds_zero": bool(low <= 0.0 <= high),
        "users": total,
        "seeds": len(groups),
        "resamples": resamples,
        "level": level,
    }
