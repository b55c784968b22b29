"""One interface for the recommenders a shop could run without this package, scored like the LLM.

A peer is anything with ``name`` and ``recommend(histories, k)``: for each history (item ids, oldest
first) the ``k`` item ids it would show, best first. :func:`peer_records` scores a peer on exactly the users
:func:`~peft_grounded.evaluation.evaluate` samples with the same :class:`~peft_grounded.evaluation.EvalSettings`
(the same seeded "all" and "cold" samples of each part), and returns the same per-user records (``user``,
``target``, ``all``, ``cold``, 0-based ``rank`` or ``None``), so that peers and LLM strategies go into one
table with paired bootstrap intervals (:func:`~peft_grounded.evaluation.compare_users`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from ..evaluation.evaluate import Results
from ..evaluation.metrics import target_rank
from ..evaluation.users import EvalSettings, rank_metrics, sampled_users, user_records


@runtime_checkable
class Recommender(Protocol):
    """A ranked list of item ids per user history."""

    name: str

    def recommend(self, histories: Sequence[Sequence[str]], k: int) -> list[list[str]]:
        """For each history (oldest item first), its ``k`` recommended item ids, best first."""
        ...


def peer_records(
    recommender: Recommender,
    split: Any,
    parts: tuple[str, ...] = ("valid", "test"),
    settings: EvalSettings | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """``{part: [record, ...]}`` of ``recommender`` on the users ``evaluate`` scores with ``settings``.

    The history of a validation user is its training history; of a test user, the training history and the
    validation item (the whole history up to the target, as the LLM's prompts give it)."""
    settings = settings or EvalSettings()
    k = max(settings.ks)
    cold_items = split.cold_items(settings.cold_max_count)
    out: dict[str, list[dict[str, Any]]] = {}
    for part in parts:
        chosen, cold_chosen, _ = sampled_users(split, part, settings, cold_items, None)
        records = user_records(chosen, cold_chosen)
        history = {e[0]: e[1] for e in chosen + cold_chosen}
        lists = recommender.recommend([history[r["user"]] for r in records], k)
        if len(lists) != len(records):
            raise RuntimeError(
                f"{recommender.name} returned {len(lists)} lists for {len(records)} histories; a peer must "
                "return one list per history"
            )
        for record, items in zip(records, lists, strict=True):
            if len(items) < k:
                raise ValueError(
                    f"{recommender.name} recommended {len(items)} items for user {record['user']!r}, fewer "
                    f"than K={k}; return at least max(ks) items per history"
                )
            record["rank"] = target_rank(items[:k], record["target"])
        out[part] = records
    return out


def peer_results(records: dict[str, list[dict[str, Any]]], settings: EvalSettings | None = None) -> Results:
    """Aggregate ``{part: {"all", "cold"}}`` Recall/NDCG of :func:`peer_records`' output."""
    settings = settings or EvalSettings()
    subsets = ("all", "cold") if settings.cold else ("all",)
    return {
        part: {s: rank_metrics([r["rank"] for r in rows if r[s]], settings.ks) for s in subsets}
        for part, rows in records.items()
    }


def exclude_seen(scores: Any, histories: Sequence[Sequence[int]]) -> Any:
    """Set the scores of each row's history items (row indices into the item axis) to ``-inf`` in place."""
    for row, seen in enumerate(histories):
        if len(seen):
            scores[row, list(seen)] = float("-inf")
    return scores
