"""Peers and LLM strategies side by side: one split, one sample of users, one table with paired intervals.

Every row is scored on the users :func:`~peft_grounded.evaluation.reports` samples with the same
:class:`~peft_grounded.evaluation.EvalSettings` (test part: all users, and the users whose target is a cold
item), so differences are paired per user. Rows carry their training minutes and threads. The peers are
what a shop could run without this package (:mod:`peft_grounded.evaluation.peers`): the most-popular ranking, text KNN
over the SID index's own item vectors (last item; recency-weighted profile), SASRec and TGH (the
transition-graph heuristic, :mod:`peft_grounded.evaluation.graph_peer`, its settings chosen on the validation
users); the LLM rows are the experiment runner's strategies (``peft_default`` is PEFT's own path, no package
code in its rows).

The answer a comparison report opens with (:func:`headline`: what the run establishes, each sentence from a
paired interval, "not established" where it holds 0) is below.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from ..evaluation import POPULARITY_LABEL, compare_users, intervals_table
from ..evaluation.reports import EvalSettings, popularity_users, user_value
from ..intervals import bootstrap_interval
from ..training import runs

PEERS = ("popularity", "knn_last", "knn_recency", "sasrec", "tgh")
PEER_LABELS = {
    "popularity": "popularity",
    "knn_last": "text KNN (last item)",
    "knn_recency": "text KNN (recency profile)",
    "sasrec": "SASRec",
    "tgh": "TGH (transition graph)",
}


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def run_peers(
    catalogue: Any,
    index: Any,
    split: Any,
    settings: EvalSettings,
    output_dir: str | Path,
    peers: Sequence[str] = PEERS,
    *,
    sasrec: Any = None,
    encoder: Any = None,
) -> dict[str, dict[str, Any]]:
    """``{peer: {"records", "minutes", "threads", ...}}`` on the test users of ``settings``; each peer's
    result is written to ``<output_dir>/<peer>.json`` and read back on a later call with the same settings.
    ``sasrec``: a :class:`~peft_grounded.sids.sasrec.SASRecConfig` (default settings when None). ``tgh``: its
    count bonus and ring limit are chosen on the validation users of ``settings``
    (:func:`~peft_grounded.evaluation.graph_peer.choose_settings`; the row keeps the choice and its table)."""
    from ..evaluation.peers import TextKNN, peer_records

    unknown = set(peers) - set(PEERS)
    if unknown:
        raise ValueError(f"unknown peers {sorted(unknown)}; choose from {', '.join(PEERS)}")
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, Any]] = {}
    for name in peers:
        key = {"peer": name, "settings": asdict(settings), "index": index.fingerprint(), "users": len(split)}
        if name == "sasrec":
            key["sasrec"] = asdict(sasrec) if sasrec is not None else "default"
        if name == "tgh":
            from ..evaluation.graph_peer import DEFAULT_BONUSES, DEFAULT_RINGS

            key["tgh"] = {"bonuses": list(DEFAULT_BONUSES), "rings": list(DEFAULT_RINGS)}
        path = out / f"{name}.json"
        if path.is_file():
            saved = json.loads(path.read_text())
            if saved.get("key") == json.loads(json.dumps(key)):
                results[name] = saved
                continue
        start = time.perf_counter()
        extra: dict[str, Any] = {}
        if name == "popularity":
            records = popularity_users(split, ("test",), settings, items=index.item_ids)
            fit_seconds = time.perf_counter() - start
        elif name.startswith("knn_"):
            knn = TextKNN.from_index(index, catalogue, encoder, profile=name.split("_")[1])
            fit_seconds = 0.0  # no training; encoding is the index's (cached)
            records = peer_records(knn, split, ("test",), settings)
        elif name == "tgh":
            from ..evaluation.graph_peer import TransitionGraphPeer, choose_settings

            graph = TransitionGraphPeer.from_index(index, catalogue, split, encoder)
            chosen, table = choose_settings(graph, split, eval_settings=settings)
            fit_seconds = time.perf_counter() - start  # the graph and the choice on validation
            records = peer_records(graph.with_settings(chosen), split, ("test",), settings)
            extra = {"chosen": asdict(chosen), "validation": table}
        else:
            from ..sids.sasrec import SASRecConfig
            from ..sids.sasrec_cache import shared_fit

            model = shared_fit(split, list(index.item_ids), sasrec or SASRecConfig())
            fit_seconds = float(getattr(model, "train_seconds", time.perf_counter() - start))
            records = peer_records(model, split, ("test",), settings)
            extra = {
                "best_epoch": getattr(model, "best_epoch", None),
                "epochs": getattr(model, "history", None),
            }
        results[name] = {
            "key": key,
            "label": PEER_LABELS[name],
            "records": records["test"],
            "minutes": fit_seconds / 60,
            "threads": _threads(),
            "seconds_total": time.perf_counter() - start,
            **extra,
        }
        runs.write_json_atomic(path, results[name])
    return results


def _in_subset(record: Mapping[str, Any], subset: str, cold_items: set[str] | None) -> bool:
    """``all`` / ``cold``: the evaluation's samples; ``warm``: the "all" sample's users whose target is not
    a cold item (needs ``cold_items``)."""
    if subset == "warm":
        if cold_items is None:
            raise ValueError("the warm subset needs the split's cold items")
        return bool(record.get("all", True)) and record["target"] not in cold_items
    return bool(record.get(subset, True))


def _values(
    records: Sequence[Mapping[str, Any]], metric: str, subset: str, cold_items: set[str] | None = None
) -> dict[Any, float]:
    return {r["user"]: user_value(r, metric) for r in records if _in_subset(r, subset, cold_items)}


def summarise_rows(
    rows: Mapping[str, Mapping[str, Any]],
    reference: str,
    metric: str = "recall@10",
    subsets: Sequence[str] = ("all", "cold"),
    *,
    cold_items: set[str] | None = None,
    resamples: int = 10_000,
) -> list[dict[str, Any]]:
    """One summary per row: per subset the mean of ``metric`` with its 95% bootstrap interval, and the paired
    difference against ``reference`` (its interval pooled over seeds: a row's ``records`` is one per-user
    list per seed, paired with the reference's seed at the same position)."""
    if reference not in rows:
        raise ValueError(f"reference {reference!r} is not among the rows {list(rows)}")
    out = []
    for name, row in rows.items():
        summary: dict[str, Any] = {
            "name": name,
            "label": row.get("label", name),
            "minutes": row.get("minutes"),
            "threads": row.get("threads"),
            "seeds": len(row["records"]),
        }
        for subset in subsets:
            seeds = [_values(r, metric, subset, cold_items) for r in row["records"]]
            if not any(seeds):
                continue
            mean = bootstrap_interval([list(v.values()) for v in seeds], resamples=resamples)
            cell = {
                "mean": mean["difference"],
                "low": mean["low"],
                "high": mean["high"],
                "users": mean["users"],
            }
            if name != reference:
                ref = [_values(r, metric, subset, cold_items) for r in rows[reference]["records"]]
                if len(ref) == 1 and len(seeds) > 1:
                    ref = ref * len(seeds)  # a deterministic reference (one run) pairs with every seed
                diffs = []
                for mine, theirs in zip(seeds, ref, strict=True):
                    if mine.keys() != theirs.keys():
                        raise ValueError(f"{name} and {reference} were scored on different users")
                    diffs.append([mine[u] - theirs[u] for u in mine])
                cell["vs_reference"] = bootstrap_interval(diffs, resamples=resamples)
            summary[subset] = cell
        out.append(summary)
    return out


def _cell(cell: Mapping[str, Any] | None, digits: int) -> str:
    if not cell:
        return "n/a"
    return f"{cell['mean']:.{digits}f} [{cell['low']:.{digits}f}, {cell['high']:.{digits}f}]"


def _diff(cell: Mapping[str, Any] | None, digits: int) -> str:
    if not cell or "vs_reference" not in cell:
        return "—"
    d = cell["vs_reference"]
    return f"{d['difference']:+.{digits}f} [{d['low']:+.{digits}f}, {d['high']:+.{digits}f}]"


SUBSET_LABELS = {"all": "all users", "warm": "warm targets", "cold": "cold targets", "new": "new items"}


def side_by_side_table(
    summaries: Sequence[Mapping[str, Any]],
    reference: str,
    metric: str = "recall@10",
    digits: int = 3,
    subsets: Sequence[str] = ("all", "cold"),
) -> str:
    """Markdown: per row and subset the metric (mean [95% CI]) and its paired difference against
    ``reference``, then seeds, training minutes and threads. A subset a row lacks shows ``n/a``."""
    label = next((s["label"] for s in summaries if s["name"] == reference), reference)
    head = " | ".join(f"{metric}, {SUBSET_LABELS.get(x, x)} | vs {label}" for x in subsets)
    lines = [
        f"| model | {head} | seeds | train min | threads |",
        "|---|" + "---|---|" * len(subsets) + "---:|---:|---:|",
    ]
    for s in summaries:
        minutes = "—" if s.get("minutes") is None else f"{s['minutes']:.1f}"
        cells = " | ".join(f"{_cell(s.get(x), digits)} | {_diff(s.get(x), digits)}" for x in subsets)
        lines.append(f"| {s['label']} | {cells} | {s['seeds']} | {minutes} | {s.get('threads') or '—'} |")
    users = ", ".join(
        f"{next((s[x]['users'] for s in summaries if x in s), 0)} {SUBSET_LABELS.get(x, x)}" for x in subsets
    )
    lines += [
        "",
        f"Users x seeds behind each column: {users}. Intervals: 95% bootstrap (users resampled within seeds); "
        "differences paired per user.",
    ]
    return "\n".join(lines) + "\n"


def strategy_row(name: str, records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A side-by-side row from the experiment runner's results of one strategy (one record per seed)."""
    minutes = [(r["timings"].get("grounding_s", 0.0) + r["timings"]["sft_s"]) / 60 for r in records]
    return {
        "label": f"LLM: {name}",
        "records": [r["users"]["test"] for r in records],
        "minutes": float(np.mean(minutes)) if minutes else math.nan,
        "threads": records[0].get("threads") if records else None,
    }


# ---------------------------------------------------------------------------------------- learning curves


def strategy_curve(record: Mapping[str, Any], metric: str = "recall@10") -> list[tuple[float, float]]:
    """``(training minutes, validation metric)`` at each validation point of a runner result (its
    ``validation_curve``, every ``Budget.eval_every`` steps): the training clock at that point (for a run
    recorded without it, at the last training log before it). Points inside a run: the learning rate is not
    annealed yet there, so a run stopping at that time would score at least as well."""
    logs = sorted(
        (e["step"], e["seconds"])
        for e in record.get("curve", {}).get("sft", {}).get("train", [])
        if "seconds" in e
    )
    points = []
    for point in record.get("validation_curve", []):
        before = [s for step, s in logs if step <= point["step"]]
        seconds = point.get("seconds", before[-1] if before else None)
        if metric in point and seconds is not None:
            points.append((seconds / 60, float(point[metric])))
    return points


def peer_curve(peer: Mapping[str, Any], metric: str = "recall@10") -> list[tuple[float, float]]:
    """``(training minutes, validation metric)`` after each epoch of a peer that records them (SASRec)."""
    return [
        (e["seconds"] / 60, float(e[f"valid_{metric}"])) for e in peer.get("epochs") or () if "seconds" in e
    ]


def curve_table(
    curves: Mapping[str, Sequence[tuple[float, float]]],
    budgets: Sequence[float] = (0.5, 1, 2, 5, 12, 30, 60, 120),
    metric: str = "recall@10",
    *,
    best_so_far: Sequence[str] = (),
    digits: int = 3,
) -> str:
    """Markdown: per row the metric reached within each budget of training minutes: its last point at or
    before the budget (for the rows named in ``best_so_far``, which keep their best epoch, the best point so
    far); ``—`` before a row's first point and past its end (a budget more than 10% beyond its last point)."""
    lines = [
        f"| model | {' | '.join(f'{b:g} min' for b in budgets)} |",
        "|---|" + "---:|" * len(budgets),
    ]
    for name, points in curves.items():
        points = sorted(points)
        cells = []
        for budget in budgets:
            within = [v for m, v in points if m <= budget]
            if not within or budget > points[-1][0] * 1.1:
                cells.append("—")
            else:
                cells.append(f"{(max(within) if name in best_so_far else within[-1]):.{digits}f}")
        lines.append(f"| {name} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


# The answer a comparison report opens with: what the run establishes, each sentence from a paired interval.
#
# Every strategy is compared with mean init (the start's effect) and with the most-popular reference, per user
# on the same test users, pooled over seeds (:mod:`peft_grounded.evaluation.reports`). A difference whose 95%
# interval excludes 0 is stated with its direction and interval; one whose interval holds 0 reads "not
# established", with its interval and no direction. The held-out targets' constrained NLL leads where it is
# established (at small budgets it is the steadier figure), Recall@K beside it.

NLL = "constrained_nll"
NOT_ESTABLISHED = "not established"


def headline_metrics(ks: Sequence[int]) -> tuple[str, str]:
    """The ranking metrics of the headline: Recall@K and NDCG@K at K = 10 when measured, else the largest."""
    k = 10 if 10 in ks else max(ks)
    return f"recall@{k}", f"ndcg@{k}"


def established(row: Mapping[str, Any]) -> str:
    """What a paired interval row (strategy - reference) lets a report say: ``"lower"`` or ``"higher"`` where
    its interval excludes 0, :data:`NOT_ESTABLISHED` where it holds 0."""
    if row["holds_zero"]:
        return NOT_ESTABLISHED
    return "lower" if row["high"] < 0 else "higher"


def claim(row: Mapping[str, Any], name: str, unit: str = "", digits: int = 3) -> str:
    """One clause of the answer from a paired interval row: ``name`` lower or higher (better or worse: NLL
    lower is better) with the difference and its 95% interval, or ``name`` not established with the interval
    that holds 0, and no direction."""
    verdict = established(row)
    span = (
        f"{row['difference']:+.{digits}f}{' ' + unit if unit else ''}, "
        f"95% interval [{row['low']:+.{digits}f}, {row['high']:+.{digits}f}]"
    )
    if verdict == NOT_ESTABLISHED:
        return f"{name} {NOT_ESTABLISHED} ({span} holds 0)"
    better = (verdict == "lower") == ("nll" in row["metric"])
    return f"{name} {verdict}, {'better' if better else 'worse'} ({span})"


PROGRESSIVE = "progressive_nll"  # the headline's metric: a run's items predicted before it trained on them


def progressive_windows(run_dir: str | Path, stage: str = "sft") -> dict[int, tuple[int, float]]:
    """``{step: (items_seen, item_nll)}`` of a strategy run's logged windows in its first epoch (their targets
    not yet trained on: :func:`~peft_grounded.training.callbacks.learning_curve`); empty when it logged none."""
    from ..diagnostics.plots import curve_stage

    part = curve_stage(run_dir, stage)
    return {
        int(p["step"]): (int(p["items_seen"]), float(p["item_nll"]))
        for p in (part or {}).get("train", [])
        if isinstance(p, dict)
        and p.get("progressive")
        and isinstance(p.get("step"), int)
        and isinstance(p.get("items_seen"), int)
        and isinstance(p.get("item_nll"), (int, float))
    }


def learning_speed(
    run_dirs: Mapping[str, Sequence[str | Path]], strategy: str, reference: str = "mean"
) -> dict[str, Any] | None:
    """How much faster ``strategy`` learnt than ``reference``: the paired difference of their progressive NLL
    (nats per item target, each logged window's targets predicted before the run trained on them), window by
    window on the same batches, resampled over the windows within each seed (:func:`bootstrap_interval`).

    ``run_dirs``: strategy -> one run folder per seed, in the same seed order. ``None`` where a run logged no
    first-epoch window. Raises ``ValueError`` where the two runs of a seed trained on other batches (their
    ``items_seen`` differ), which no pairing could compare."""
    differences = []
    steps = 0
    for mine, theirs in zip(run_dirs[strategy], run_dirs[reference], strict=True):
        a, b = progressive_windows(mine), progressive_windows(theirs)
        shared = sorted(set(a) & set(b))
        if not shared:
            return None
        unpaired = [s for s in shared if a[s][0] != b[s][0]]
        if unpaired:
            raise ValueError(
                f"{mine} and {theirs} trained on other batches (items seen at step {unpaired[0]}: "
                f"{a[unpaired[0]][0]} and {b[unpaired[0]][0]}); their learning curves cannot be paired"
            )
        differences.append([a[s][1] - b[s][1] for s in shared])
        steps = max(steps, shared[-1])
    row = bootstrap_interval(differences)
    return row | {
        "strategy": strategy,
        "reference": f"{reference} init" if reference == "mean" else reference,
        "metric": PROGRESSIVE,
        "windows": sum(len(d) for d in differences),
        "steps": steps,
        "claim": established(row),
    }


def learning_speed_sentence(row: Mapping[str, Any]) -> str:
    """The report's headline from a :func:`learning_speed` row: its direction where the interval excludes 0,
    "not established" where it holds 0."""
    seeds = row["seeds"]
    who = f"{row['windows'] // seeds} logged windows of its first {row['steps']} SFT steps" + (
        f" x {seeds} seeds" if seeds > 1 else ""
    )
    text = claim(row, "progressive NLL", "nats per item")
    return (
        f"**Headline: how fast each start learns** ({row['strategy']} against {row['reference']}; the items of "
        f"each training batch predicted before the run trained on them, the same batches for both, {who}): "
        f"{text}."
    )


def _zero_hits(records: Mapping[str, Sequence[Mapping[str, Any]]], metric: str, part: str) -> bool:
    """Whether every run of every strategy reports ``metric`` 0 on ``part``'s users."""
    values = [r["metrics"][part]["all"].get(metric) for recs in records.values() for r in recs]
    return bool(values) and all(v == 0 for v in values)


def headline(
    records: Mapping[str, Sequence[Mapping[str, Any]]],
    popularity_users: Sequence[Mapping[str, list]] | None,
    ks: Sequence[int],
    *,
    part: str = "test",
    reference: str = "mean",
    resamples: int = 10_000,
) -> tuple[list[str], list[dict[str, Any]]]:
    """Markdown lines and the interval rows (JSON-able, each with its ``claim``: :func:`established`) of the
    report's opening section: per strategy against mean init and against the popularity reference, the
    held-out NLL and Recall@K, each a :func:`claim` from its paired interval (established ones first).

    ``records``: strategy -> one run record per seed (``metrics``, ``likelihood`` and, for runs that
    recorded them, ``users``); ``popularity_users``: per seed, :func:`~peft_grounded.evaluation.popularity_users`
    on the same settings (or ``None``).
    """
    recall, ndcg = headline_metrics(ks)
    label = recall.replace("recall", "Recall")
    users = {
        name: [r["users"][part] for r in recs]
        for name, recs in records.items()
        if all("users" in r for r in recs)
    }
    missing = sorted(set(records) - set(users))
    references: dict[str, list] = {}
    if reference in users:
        references[f"{reference} init"] = users[reference]
    if popularity_users is not None:
        references[POPULARITY_LABEL] = [p[part] for p in popularity_users]
    rows: list[dict[str, Any]] = []
    body: list[str] = []
    lines = ["## The answer", ""]
    if _zero_hits(records, recall, part):
        lines += [f"No strategy ranks a {part} target in its top {label.split('@')[-1]} at this budget "
                  f"({label} 0 for all).", ""]  # fmt: skip
    named = {(f"{reference} init" if n == reference else n): v for n, v in users.items()}
    if users and references:
        rows = compare_users(named, references, [recall, ndcg, NLL], "all", resamples=resamples)
    if rows:
        for row in rows:
            row["claim"] = established(row)
        seeds = rows[0]["seeds"]
        pooled = f", pooled over {seeds} seeds (users resampled within each)" if seeds > 1 else ""
        lines += [
            f"What this run establishes on the same {rows[0]['users'] // seeds} {part} users"
            f"{pooled}: each sentence is the paired difference (strategy - reference) with its bootstrap 95% "
            f"interval; a direction where the interval excludes 0, '{NOT_ESTABLISHED}' where it holds 0. NLL: "
            f"the held-out target's nats per item under the SID trie (lower is better).",
            "",
        ]
        for ref in references:
            for name in named:
                found = {r["metric"]: r for r in rows if (r["strategy"], r["reference"]) == (name, ref)}
                clauses = [
                    (established(found[m]) == NOT_ESTABLISHED, order, claim(found[m], what, unit))
                    for order, (m, what, unit) in enumerate(
                        ((NLL, "held-out NLL", "nats per item"), (recall, label, ""))
                    )
                    if m in found
                ]
                if clauses:
                    text = "; ".join(c for *_, c in sorted(clauses))
                    lines.append(f"- **{name}** against {ref}: {text}.")
        lines.append("")
        body = [
            f"Paired bootstrap 95% intervals of the difference (strategy - reference) on the same {part} users, "
            f"{resamples:,} resamples{', users resampled within each of the ' + str(seeds) + ' seeds' if seeds > 1 else ''}. "
            "For NLL lower is better (a negative difference is an improvement). A difference whose interval "
            "holds 0 is not established at this budget.",
            "",
            intervals_table(rows),
        ]
    elif users:
        lines += [
            f"No paired reference to compare with (mean init's or the popularity reference's per-user {part} "
            "results): no interval, so no claim.",
            "",
        ]
    lines += body
    if missing:
        lines += [
            f"No per-user results for {', '.join(missing)} (runs finished before they were recorded): no "
            "intervals, so no claim about them.",
            "",
        ]
    return lines, rows
