"""The answer a comparison report opens with: which strategy won, by how much, and how sure that is.

The winner is the strategy with the best test Recall@K (``K`` = 10 when measured), ties broken by the
constrained NLL; the likelihood winner is named too (at small budgets it is the figure that moves). Every
strategy is compared with mean init and with the most-popular reference by paired bootstrap intervals
(:mod:`peft_grounded.evaluation.intervals`), pooled over seeds, on the same test users.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from ..evaluation import POPULARITY_LABEL, compare_users, intervals_table

NLL = "constrained_nll"


def headline_metrics(ks: Sequence[int]) -> tuple[str, str]:
    """The ranking metrics of the headline: Recall@K and NDCG@K at K = 10 when measured, else the largest."""
    k = 10 if 10 in ks else max(ks)
    return f"recall@{k}", f"ndcg@{k}"


def _mean(
    records: Sequence[Mapping[str, Any]], section: str, metric: str, part: str = "test"
) -> float | None:
    values = [r[section][part]["all"].get(metric) for r in records if part in r.get(section, {})]
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def headline(
    records: Mapping[str, Sequence[Mapping[str, Any]]],
    popularity_users: Sequence[Mapping[str, list]] | None,
    ks: Sequence[int],
    *,
    part: str = "test",
    reference: str = "mean",
    resamples: int = 10_000,
) -> tuple[list[str], list[dict[str, Any]]]:
    """Markdown lines and the interval rows (JSON-able) of the report's opening section.

    ``records``: strategy -> one run record per seed (``metrics``, ``likelihood`` and, for runs that
    recorded them, ``users``); ``popularity_users``: per seed, :func:`~peft_grounded.evaluation.popularity_users`
    on the same settings (or ``None``).
    """
    recall, ndcg = headline_metrics(ks)
    scores = {
        name: (_mean(recs, "metrics", recall, part), _mean(recs, "likelihood", NLL, part))
        for name, recs in records.items()
    }
    ranked = sorted(
        scores,
        key=lambda n: (-(scores[n][0] or 0.0), scores[n][1] if scores[n][1] is not None else float("inf")),
    )
    best = ranked[0]
    r_best = scores[best][0]
    label = recall.replace("recall", "Recall")
    if r_best is None:
        text = f"**{best}** leads"
    elif r_best == 0:
        text = f"No strategy ranks a {part} target in its top {label.split('@')[-1]} at this budget ({label} 0 for all)"
    else:
        text = f"**{best}** has the best {part} {label} ({r_best:.4f})"
    if reference in scores and best != reference and scores[reference][0] is not None and r_best:
        text += (
            f", {r_best - scores[reference][0]:+.4f} against {reference} init ({scores[reference][0]:.4f})"
        )
    likely = min((n for n in scores if scores[n][1] is not None), key=lambda n: scores[n][1], default=None)
    if likely is not None:
        text += f"; the lowest held-out NLL is **{likely}**'s ({scores[likely][1]:.3f} nats per item under the SID trie)"

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
    if users and references:
        named = {(f"{reference} init" if n == reference else n): v for n, v in users.items()}
        rows = compare_users(named, references, [recall, ndcg, NLL], "all", resamples=resamples)
        seeds = len(next(iter(users.values())))
        body = [
            f"Paired bootstrap 95% intervals of the difference (strategy - reference) on the same {part} users, "
            f"{resamples:,} resamples{', users resampled within each of the ' + str(seeds) + ' seeds' if seeds > 1 else ''}. "
            "For NLL lower is better (a negative difference is an improvement). A difference whose interval "
            "holds 0 is not established at this budget.",
            "",
            intervals_table(rows),
        ]
    winner = "mean init" if best == reference else best
    for ref in references:
        for metric, name in ((recall, label), (NLL, "NLL")):
            row = next(
                (r for r in rows if (r["strategy"], r["reference"], r["metric"]) == (winner, ref, metric)),
                None,
            )
            if row is not None:
                verdict = "the interval holds 0" if row["holds_zero"] else "the interval excludes 0"
                text += (
                    f". {name} of {best} minus {ref}: {row['difference']:+.4f}, 95% interval "
                    f"[{row['low']:+.4f}, {row['high']:+.4f}] ({verdict})"
                )
    lines = ["## The answer", "", text + ".", "", *body]
    if missing:
        lines += [
            f"No per-user results for {', '.join(missing)} (runs finished before they were recorded): no intervals.",
            "",
        ]
    return lines, rows
