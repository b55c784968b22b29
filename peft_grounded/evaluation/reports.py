"""Evaluation of a SID recommender: metrics per split (valid, test) on all users and on cold-item targets.

Results are plain dicts, ``{split: {"all": metrics, "cold": metrics, "decoding": counters}}`` with
``metrics`` as returned by :func:`~peft_grounded.evaluation.metrics.ranking_metrics`; they serialise to
JSON as they are and render as markdown tables. Files are written atomically (temp file + ``os.replace``).

Paired bootstrap intervals between models on the same users, pooled over training seeds
(:func:`paired_intervals`, :func:`compare_users`, :func:`intervals_table`), and the users an evaluation scores
(seeded samples, the cold ones) with the most-popular ranking, are below.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Collection, Hashable, Mapping, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._io import atomic_write_text
from ..intervals import RESAMPLES, bootstrap_interval
from .metrics import DEFAULT_KS, EvalSettings, metric_names, metric_value, rank_metrics, ranking_metrics

Results = dict[str, Any]


def evaluate_split(
    predictions: Sequence[Sequence[Hashable]],
    targets: Sequence[Hashable],
    cold_items: Collection[Hashable] | None = None,
    ks: Sequence[int] = DEFAULT_KS,
    items: Collection[Hashable] | None = None,
) -> Results:
    """Metrics on all users and, when ``cold_items`` is given, on the users whose target is cold.

    ``predictions`` are ranked lists, e.g. ``peft_grounded.decoding.recommend(...).items``; with the catalogue's
    ``items``, a target outside it (which no decoding can produce) is refused. To sample a split's users,
    render their prompts, decode and score them in one pass, use :func:`~.evaluator.evaluate`.
    """
    if items is not None:
        unknown = [t for t in targets if t not in items]
        if unknown:
            raise ValueError(
                f"{len(unknown)} targets are not in the catalogue (first: {unknown[0]!r}); every target item "
                "needs a SID"
            )
    result: Results = {"all": ranking_metrics(predictions, targets, ks)}
    if cold_items is not None:
        cold = set(cold_items)
        users = [u for u, target in enumerate(targets) if target in cold]
        result["cold"] = ranking_metrics([predictions[u] for u in users], [targets[u] for u in users], ks)
    return result


def evaluate_predictions(
    splits: Mapping[str, tuple[Sequence[Sequence[Hashable]], Sequence[Hashable]]],
    cold_items: Collection[Hashable] | None = None,
    ks: Sequence[int] = DEFAULT_KS,
    items: Collection[Hashable] | None = None,
) -> Results:
    """:func:`evaluate_split` for each ``split name -> (predictions, targets)``."""
    return {
        name: evaluate_split(preds, targets, cold_items, ks, items)
        for name, (preds, targets) in splits.items()
    }


# -- rendering ------------------------------------------------------------------------------------


def _label(name: str) -> str:
    kind, k = name.split("@")
    return f"{'R' if kind == 'recall' else 'N'}@{k}"


def _ks_of(metrics: Mapping[str, Any]) -> list[int]:
    return sorted(int(key.split("@")[1]) for key in metrics if key.startswith("recall@"))


def _cells(metrics: Mapping[str, Any], names: Sequence[str]) -> list[str]:
    return ["–" if metrics.get(n) is None else f"{metrics[n]:.4f}" for n in names]


def markdown_table(results: Results, title: str | None = None) -> str:
    """One row per (split, subset) of :func:`evaluate_split` results: R@K, N@K and the number of users."""
    rows: list[tuple[str, str, Mapping[str, Any]]] = [
        (split, subset, metrics)
        for split, parts in results.items()
        for subset, metrics in parts.items()
        if subset != "decoding"
    ]
    if not rows:
        raise ValueError("no results to tabulate")
    names = metric_names(_ks_of(rows[0][2]))
    lines = [f"### {title}", ""] if title else []
    lines.append("| split | targets | users | " + " | ".join(_label(n) for n in names) + " |")
    lines.append("|---|---|---:|" + "---:|" * len(names))
    for split, subset, metrics in rows:
        lines.append(
            f"| {split} | {subset} | {metrics['users']} | " + " | ".join(_cells(metrics, names)) + " |"
        )
    return "\n".join(lines) + "\n"


def comparison_table(
    results_by_name: Mapping[str, Results], split: str = "test", subset: str = "all", title: str | None = None
) -> str:
    """One row per run (e.g. per initialisation strategy) for one split and subset."""
    if not results_by_name:
        raise ValueError("no runs to compare")
    missing = [n for n, r in results_by_name.items() if subset not in r.get(split, {})]
    if missing:
        raise ValueError(f"runs {missing} have no {split!r}/{subset!r} results")
    first = next(iter(results_by_name.values()))[split][subset]
    names = metric_names(_ks_of(first))
    lines = [f"### {title}", ""] if title else []
    lines.append("| run | users | " + " | ".join(_label(n) for n in names) + " |")
    lines.append("|---|---:|" + "---:|" * len(names))
    for run, results in results_by_name.items():
        metrics = results[split][subset]
        lines.append(f"| {run} | {metrics['users']} | " + " | ".join(_cells(metrics, names)) + " |")
    return "\n".join(lines) + "\n"


# -- files ----------------------------------------------------------------------------------------


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` through a temp file in the same folder and ``os.replace``."""
    return atomic_write_text(path, text)


def write_json(path: str | os.PathLike[str], results: Results) -> Path:
    """Results as indented JSON (fails on values JSON cannot hold, before touching ``path``)."""
    return write_text_atomic(path, json.dumps(results, indent=2, allow_nan=False) + "\n")


def write_markdown(path: str | os.PathLike[str], results: Results, title: str | None = None) -> Path:
    """:func:`markdown_table` of ``results`` to ``path``."""
    return write_text_atomic(path, markdown_table(results, title))


# Which users an evaluation scores, its settings, and the most-popular reference on the same users.
#
# For each part (``valid``, ``test``) a seeded sample of users gives the "all" metrics, and a seeded sample
# of as many users whose target is a cold item gives the "cold" ones (cold targets are rare: a sample of
# all users would hold few of them). Both samples are scored together (see :func:`~.evaluator.evaluate`).


def _sample(items: list, n: int | None, seed: int) -> list:
    return list(items) if n is None or n >= len(items) else random.Random(seed).sample(items, n)


def sampled_users(
    split: Any, part: str, settings: EvalSettings, cold_items: set[str], max_history: int | None
):
    """The part's sampled examples ``(user, history, target)``, its sampled cold-target examples, and all
    its cold-target examples: the users every evaluation of ``settings`` scores (LLM and peers alike)."""
    examples = list(getattr(split, f"{part}_examples")(max_history))
    chosen = _sample(examples, settings.users, settings.seed)
    cold_pool = [e for e in examples if e[2] in cold_items] if settings.cold else []
    return chosen, _sample(cold_pool, settings.users, settings.seed), cold_pool


def _part_prompts(split, part, settings, cold_items, index, tokenizer, catalogue, fmt):
    """:func:`sampled_users` of a part, plus the prompts of every user either sample holds (each once)."""
    from ..prompts import inference_prompts

    chosen, cold_chosen, cold_pool = sampled_users(split, part, settings, cold_items, fmt.max_history)
    todo = list({e[0]: e for e in chosen + cold_chosen}.values())
    return (chosen, cold_chosen, cold_pool), inference_prompts(todo, index, tokenizer, catalogue, fmt)


def _autocast(model: Any, settings: EvalSettings):
    device = next(model.parameters()).device.type
    if settings.bf16:
        from ..precision import warn_if_emulated

        warn_if_emulated("bf16 decoding (bf16=True, --bf16)", device)
    return torch.autocast(device, dtype=torch.bfloat16) if settings.bf16 else nullcontext()


POPULARITY_LABEL = "popularity (reference, no model)"  # its row name in comparison tables


def popularity_users(
    split: Any,
    parts: tuple[str, ...] = ("valid", "test"),
    settings: EvalSettings | None = None,
    items: Sequence[str] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Per-user records of the most-popular reference on the users :func:`~.evaluator.evaluate` samples with
    the same ``settings`` (same fields as its records): every user gets the items most often a training
    target, best first; with the catalogue's ``items``, ``constrained_nll`` is ``-log p(target)`` under the
    add-one-smoothed target frequencies."""
    settings = settings or EvalSettings()
    counts = split.training_target_counts()
    top = [item for item, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[: max(settings.ks)]]
    if len(top) < max(settings.ks):
        raise ValueError(
            f"only {len(top)} distinct training targets, fewer than K={max(settings.ks)}: lower the ks"
        )
    rank_of = {item: rank for rank, item in enumerate(top)}
    denominator = None
    if items is not None:
        unknown = set(counts) - set(items)
        if unknown:
            raise ValueError(
                f"{len(unknown)} training targets (e.g. {sorted(unknown)[:3]}) are not among the given items: "
                "pass every catalogue item"
            )
        denominator = sum(counts.values()) + len(set(items))
    cold_items = split.cold_items(settings.cold_max_count)
    out: dict[str, list[dict[str, Any]]] = {}
    for part in parts:
        chosen, cold_chosen, _ = sampled_users(split, part, settings, cold_items, None)
        records = user_records(chosen, cold_chosen)
        for record in records:
            record["rank"] = rank_of.get(record["target"])
            if denominator is not None:
                record["constrained_nll"] = -math.log((counts.get(record["target"], 0) + 1) / denominator)
        out[part] = records
    return out


def evaluate_popularity(
    split: Any,
    parts: tuple[str, ...] = ("valid", "test"),
    settings: EvalSettings | None = None,
    items: Sequence[str] | None = None,
) -> Results:
    """The most-popular reference (:func:`popularity_users`) as aggregate results, ``{part: {"all", "cold"}}``.

    With the catalogue's ``items`` it also gives ``constrained_nll``, the likelihood reference of the
    model's. A recommender that does not beat these has learnt popularity at best; cold targets score ~0
    on the ranking metrics by design.
    """
    settings = settings or EvalSettings()
    users = popularity_users(split, parts, settings, items)
    results: Results = {}
    for part, records in users.items():
        results[part] = {}
        for subset in ("all", "cold") if settings.cold else ("all",):
            chosen = [r for r in records if r[subset]]
            metrics = rank_metrics([r["rank"] for r in chosen], settings.ks)
            if items is not None:
                nll = [r["constrained_nll"] for r in chosen]
                metrics["constrained_nll"] = math.fsum(nll) / len(nll) if nll else None
            results[part][subset] = metrics
        if settings.cold:
            cold_pool = sampled_users(split, part, settings, split.cold_items(settings.cold_max_count), None)[
                2
            ]
            results[part]["cold"]["cold_users_available"] = len(cold_pool)
    return results


def user_records(chosen: list, cold_chosen: list) -> list[dict[str, Any]]:
    """One record per user of either sample (each once, in sample order): user, target and membership."""
    in_all = {e[0] for e in chosen}
    in_cold = {e[0] for e in cold_chosen}
    unique = {e[0]: e for e in chosen + cold_chosen}
    return [
        {"user": user, "target": e[2], "all": user in in_all, "cold": user in in_cold}
        for user, e in unique.items()
    ]


# Paired bootstrap confidence intervals for the difference of a strategy against a reference.
#
# Every strategy of a comparison is evaluated on the same seeded users (the sample depends on the seed and
# the split only), so the difference is paired: per user, ``value(strategy) - value(reference)``, with the
# value read from the per-user records of :func:`~.evaluator.evaluate` (or
# :func:`~.reports.popularity_users`): ``recall@K`` (1 if the 0-based rank < K), ``ndcg@K``
# (``1 / log2(rank + 2)`` if rank < K) or a likelihood (``nll``, ``constrained_nll``; lower is better, so a
# negative difference is an improvement).
#
# **Pooling over seeds.** With several seeds the statistic is the mean difference over all (seed, user)
# pairs, and each bootstrap resample draws, *within each seed*, as many users as that seed has, with
# replacement (a stratified bootstrap: the seeds are fixed, the users are the sampling unit). With one
# seed it is the ordinary paired bootstrap. The interval is the 2.5 / 97.5% percentiles of the resampled
# statistic (95%); resamples come from ``numpy.random.default_rng(seed)``, so results are reproducible.
# A difference whose interval holds 0 is reported as such (``holds_zero``).


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


def paired_intervals(
    runs: Sequence[Sequence[Mapping[str, Any]]],
    references: Sequence[Sequence[Mapping[str, Any]]],
    metrics: Sequence[str],
    subset: str = "all",
    *,
    resamples: int = RESAMPLES,
    seed: int = 0,
    run_sd: Mapping[str, float] | None = None,
) -> dict[str, dict[str, Any]]:
    """``metric -> interval`` of ``runs - references``: one per-user record list per seed on each side,
    paired by user within seed (both sides must hold the same users). ``run_sd``: metric -> one training
    run's spread (:func:`~peft_grounded.intervals.run_spread`), added to the users' (none: users only)."""
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
        spread = (run_sd or {}).get(metric, 0.0)
        out[metric] = bootstrap_interval(diffs, resamples=resamples, seed=seed, run_sd=spread)
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
        return "not established (interval holds 0)"
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
