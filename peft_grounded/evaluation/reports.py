"""Evaluation of a SID recommender: metrics per split (valid, test) on all users and on cold-item targets.

Results are plain dicts, ``{split: {"all": metrics, "cold": metrics, "decoding": counters}}`` with
``metrics`` as returned by :func:`~peft_grounded.evaluation.metrics.ranking_metrics`; they serialise to
JSON as they are and render as markdown tables. Files are written atomically (temp file + ``os.replace``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .._io import atomic_write_text
from .metrics import DEFAULT_KS, metric_names, ranking_metrics

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
