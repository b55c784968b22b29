"""Paired bootstrap confidence intervals for the difference of a strategy against a reference.

Every strategy of a comparison is evaluated on the same seeded users (the sample depends on the seed and
the split only), so the difference is paired: per user, ``value(strategy) - value(reference)``, with the
value read from the per-user records of :func:`~.evaluator.evaluate` (or
:func:`~.users.popularity_users`): ``recall@K`` (1 if the 0-based rank < K), ``ndcg@K``
(``1 / log2(rank + 2)`` if rank < K) or a likelihood (``nll``, ``constrained_nll``; lower is better, so a
negative difference is an improvement).

**Pooling over seeds.** With several seeds the statistic is the mean difference over all (seed, user)
pairs, and each bootstrap resample draws, *within each seed*, as many users as that seed has, with
replacement (a stratified bootstrap: the seeds are fixed, the users are the sampling unit). With one
seed it is the ordinary paired bootstrap. The interval is the 2.5 / 97.5% percentiles of the resampled
statistic (95%); resamples come from ``numpy.random.default_rng(seed)``, so results are reproducible.
A difference whose interval holds 0 is reported as such (``holds_zero``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .metrics import metric_value

RESAMPLES = 10_000
_CHUNK = 4_000_000  # resample x user entries drawn at once (32 MB of int64)


def user_value(record: Mapping[str, Any], metric: str) -> float:
    """One user's value of ``metric`` (``recall@K``, ``ndcg@K``, or a NLL field) from its record."""
    if metric.startswith(("recall@", "ndcg@")):
        if "rank" not in record:
            raise KeyError(f"record of user {record.get('user')!r} has no rank: evaluate with ranking=True")
        return metric_value(record["rank"], metric)
    value = record.get(metric)
    if value is None:
        raise KeyError(
            f"record of user {record.get('user')!r} has no {metric!r}: evaluate with likelihood=True "
            "(the popularity reference needs the catalogue's items for its NLL)"
        )
    return float(value)


def user_values(records: Sequence[Mapping[str, Any]], metric: str, subset: str = "all") -> dict[Any, float]:
    """``user -> value`` of ``metric`` for the records in ``subset`` (``"all"`` or ``"cold"``)."""
    return {r["user"]: user_value(r, metric) for r in records if r.get(subset, True)}


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


def paired_intervals(
    runs: Sequence[Sequence[Mapping[str, Any]]],
    references: Sequence[Sequence[Mapping[str, Any]]],
    metrics: Sequence[str],
    subset: str = "all",
    *,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> dict[str, dict[str, Any]]:
    """``metric -> interval`` of ``runs - references``: one per-user record list per seed on each side,
    paired by user within seed (both sides must hold the same users)."""
    if len(runs) != len(references):
        raise ValueError(f"{len(runs)} seeds of the strategy against {len(references)} of the reference")
    out: dict[str, dict[str, Any]] = {}
    for metric in metrics:
        diffs = []
        for s, (run, ref) in enumerate(zip(runs, references, strict=True)):
            a, b = user_values(run, metric, subset), user_values(ref, metric, subset)
            if a.keys() != b.keys():
                missing = sorted(set(a) ^ set(b), key=str)[:3]
                raise ValueError(
                    f"seed {s}: the strategy and the reference were scored on different users "
                    f"(e.g. {missing}); evaluate both with the same settings and seed"
                )
            diffs.append(np.array([a[u] - b[u] for u in a]))
        out[metric] = bootstrap_interval(diffs, resamples=resamples, seed=seed)
    return out


def compare_users(
    users: Mapping[str, Sequence[Sequence[Mapping[str, Any]]]],
    references: Mapping[str, Sequence[Sequence[Mapping[str, Any]]]],
    metrics: Sequence[str],
    subset: str = "all",
    *,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Rows ``{"strategy", "reference", "metric", "subset", ...interval}`` for every strategy against every
    reference (a strategy is not compared with itself). ``users``/``references``: name -> one per-user record
    list per seed, for one part (e.g. ``record["users"]["test"]``). A metric a side lacks (e.g. NLL of a
    reference evaluated without items) is skipped."""
    rows = []
    for ref_name, ref in references.items():
        for name, runs in users.items():
            if name == ref_name:
                continue
            for metric in metrics:
                try:
                    interval = paired_intervals(runs, ref, [metric], subset, resamples=resamples, seed=seed)
                except KeyError:
                    continue
                rows.append(
                    {"strategy": name, "reference": ref_name, "metric": metric, "subset": subset}
                    | interval[metric]
                )
    return rows


def _verdict(row: Mapping[str, Any]) -> str:
    if row["holds_zero"]:
        return "interval holds 0"
    better = (row["difference"] < 0) if "nll" in row["metric"] else (row["difference"] > 0)
    return "better" if better else "worse"


def intervals_table(rows: Sequence[Mapping[str, Any]], digits: int = 4) -> str:
    """Markdown table of :func:`compare_users` rows: difference, 95% interval and verdict."""
    if not rows:
        raise ValueError("no intervals to tabulate")
    lines = [
        "| strategy | vs | metric | subset | difference | 95% interval | pairs (seeds) | verdict |",
        "|---|---|---|---|---:|---|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['strategy']} | {r['reference']} | {r['metric']} | {r['subset']} | "
            f"{r['difference']:+.{digits}f} | [{r['low']:+.{digits}f}, {r['high']:+.{digits}f}] | "
            f"{r['users']} ({r['seeds']} seed{'s' if r['seeds'] > 1 else ''}) | {_verdict(r)} |"
        )
    return "\n".join(lines) + "\n"
