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
    run_sd: float = 0.0,
) -> dict[str, Any]:
    """Percentile interval of the mean paired difference, pooled over groups (seeds).

    ``differences``: one array of per-user differences per seed. Users are resampled within each seed.
    ``run_sd`` > 0 adds the spread of training itself: the standard deviation of one training run's mean
    metric on fixed users (:func:`run_spread`). Each seed's difference of two runs then moves by a normal
    draw of variance ``2 * run_sd**2`` in every resample, on top of the users'.
    Returns ``{"difference", "low", "high", "holds_zero", "users", "seeds", "resamples", "level", "run_sd"}``.
    """
    groups = [np.asarray(d, dtype=np.float64).ravel() for d in differences]
    groups = [g for g in groups if g.size]
    if not groups:
        raise ValueError("no paired users to compare")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    if not (run_sd >= 0 and math.isfinite(run_sd)):
        raise ValueError(f"run_sd is a standard deviation (>= 0), got {run_sd}")
    total = sum(g.size for g in groups)
    rng = np.random.default_rng(seed)
    sums = np.zeros(resamples)
    for group in groups:
        step = max(1, _CHUNK // group.size)
        for start in range(0, resamples, step):
            stop = min(start + step, resamples)
            idx = rng.integers(0, group.size, size=(stop - start, group.size))
            sums[start:stop] += group[idx].sum(axis=1)
        if run_sd > 0:  # this seed's two trainings, each off its expected mean by N(0, run_sd^2)
            sums += group.size * rng.normal(0.0, math.sqrt(2.0) * run_sd, resamples)
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
        "run_sd": run_sd,
    }


def run_spread(repeat_differences: Sequence[float]) -> float:
    """The standard deviation of one training run's mean metric on fixed users, from repeats: each value the
    mean paired difference of two runs of one recipe at one seed, on the same users (so no user sampling is
    in it, only training). Two runs differ by N(0, 2 sd^2): sd = sqrt(mean(d^2) / 2)."""
    values = [float(d) for d in repeat_differences]
    if not values:
        raise ValueError("run_spread needs at least one pair of repeated runs")
    if not all(math.isfinite(d) for d in values):
        raise ValueError(f"run_spread takes finite differences, got {values}")
    return math.sqrt(math.fsum(d * d for d in values) / (2 * len(values)))
