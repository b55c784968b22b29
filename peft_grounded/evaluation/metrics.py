"""Leave-one-out ranking metrics: one held-out target item per user, a ranked list of predictions.

With a single relevant item the ideal DCG is 1, so for a target at 0-based rank ``r < K``
``NDCG@K = 1 / log2(r + 2)`` (and 0 otherwise), and ``Recall@K = HitRate@K = 1[r < K]``.
:func:`metric_value` is that formula, the only one: every mean (:func:`rank_metrics`, from ranks;
:func:`ranking_metrics`, from ranked lists) and every per-user value of the paired intervals
(:func:`~.reports.user_value`) goes through it.

:class:`EvalSettings` (below): the settings of an evaluation, one flag each; they parse without torch.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

DEFAULT_KS: tuple[int, ...] = (1, 5, 10, 20)


def target_rank(predicted: Sequence[Hashable], target: Hashable) -> int | None:
    """0-based rank of ``target`` in ``predicted``, or ``None`` when it is absent."""
    for rank, item in enumerate(predicted):
        if item == target:
            return rank
    return None


def metric_value(rank: int | None, metric: str) -> float:
    """One user's ``recall@K`` (1.0 when the 0-based ``rank`` < K) or ``ndcg@K`` (``1 / log2(rank + 2)`` when
    ``rank`` < K); 0.0 otherwise, or when the target is absent (``rank`` None)."""
    kind, _, k = metric.partition("@")
    if kind not in ("recall", "ndcg") or not k.isdigit():
        raise ValueError(f"unknown ranking metric {metric!r}: use recall@K or ndcg@K")
    if rank is None or rank >= int(k):
        return 0.0
    return 1.0 if kind == "recall" else 1.0 / math.log2(rank + 2)


def recall_at_k(predicted: Sequence[Hashable], target: Hashable, k: int) -> float:
    """1.0 when ``target`` is among the first ``k`` predictions, else 0.0."""
    return metric_value(target_rank(predicted[:k], target), f"recall@{k}")


def ndcg_at_k(predicted: Sequence[Hashable], target: Hashable, k: int) -> float:
    """``1 / log2(rank + 2)`` when ``target`` is among the first ``k`` predictions, else 0.0."""
    return metric_value(target_rank(predicted[:k], target), f"ndcg@{k}")


def rank_metrics(ranks: Sequence[int | None], ks: Sequence[int]) -> dict[str, float | int | None]:
    """Mean Recall@K and NDCG@K over users from their targets' 0-based ranks (``None``: absent), plus
    ``users`` (their number); with no users the metrics are ``None``."""
    ks = _check_ks(ks)
    n = len(ranks)
    result: dict[str, float | int | None] = {}
    for name in metric_names(ks):
        result[name] = math.fsum(metric_value(r, name) for r in ranks) / n if n else None
    result["users"] = n
    return result


def metric_names(ks: Sequence[int] = DEFAULT_KS) -> list[str]:
    """Names of the metrics :func:`ranking_metrics` returns, in table order."""
    ks = _check_ks(ks)
    return [f"recall@{k}" for k in ks] + [f"ndcg@{k}" for k in ks]


def ranking_metrics(
    predictions: Sequence[Sequence[Hashable]],
    targets: Sequence[Hashable],
    ks: Sequence[int] = DEFAULT_KS,
) -> dict[str, float | int | None]:
    """Mean Recall@K and NDCG@K over users, plus ``users`` (their number).

    ``predictions[u]`` is user ``u``'s ranked list (best first, no repeats, at least ``max(ks)`` long) and
    ``targets[u]`` the held-out item. With no users the metrics are ``None``.
    """
    ks = _check_ks(ks)
    if len(predictions) != len(targets):
        raise ValueError(f"{len(predictions)} prediction lists for {len(targets)} targets: give one per user")
    for user, predicted in enumerate(predictions):
        if isinstance(predicted, (str, bytes)):
            raise TypeError(
                f"user {user}: predictions must be a list of item ids, got the string {predicted!r}"
            )
        if len(predicted) < ks[-1]:
            raise ValueError(
                f"user {user} has {len(predicted)} predictions, fewer than K={ks[-1]}: "
                f"decode at least {ks[-1]} items per user, or drop K={ks[-1]} from ks"
            )
        if len(set(predicted)) != len(predicted):
            raise ValueError(f"user {user}: the predicted list repeats an item; rank each item once")
    ranks = [
        target_rank(predicted[: ks[-1]], target)
        for predicted, target in zip(predictions, targets, strict=True)
    ]
    return rank_metrics(ranks, ks)


def _check_ks(ks: Sequence[int]) -> list[int]:
    values = sorted(set(ks))
    if not values or any(not isinstance(k, int) or isinstance(k, bool) or k < 1 for k in values):
        raise ValueError(f"ks must be positive integers, got {list(ks)}")
    return values


# The settings of an evaluation: which users, which cut-offs, how to decode (light: no torch, so that
# ``peft-grounded evaluate --help`` and other readers of the settings stay fast).


@dataclass
class EvalSettings:
    """How many users, which cut-offs, and how to decode."""

    ks: list[int] = field(
        default_factory=lambda: list(DEFAULT_KS), metadata={"help": "Cut-offs K of Recall@K / NDCG@K."}
    )
    users: int | None = field(
        default=None,
        metadata={"help": "Evaluate a seeded sample of this many users per part (None: every user)."},
    )
    seed: int = field(default=0, metadata={"help": "Seed of the user samples."})
    num_beams: int = field(default=20, metadata={"help": "Beams of the constrained beam search."})
    decode_batch_size: int = field(default=16, metadata={"help": "Prompts decoded per batch."})
    cold_max_count: int = field(
        default=1, metadata={"help": "Cold item: a target seen at most this often as a training target."}
    )
    cold: bool = field(default=True, metadata={"help": "Also score the users whose target is a cold item."})
    bf16: bool = field(default=False, metadata={"help": "bf16 base and decoding (bf16 autocast)."})
    exclude_history: bool = field(
        default=True,
        metadata={
            "help": "Leave the user's own history items out of the ranked list (inside the beam search), as "
            "recommend serves it and the peers rank; --no_exclude_history keeps them (a new-item rule stored "
            "with the adapter always leaves them out)."
        },
    )

    def __post_init__(self) -> None:
        from .. import checks

        ks_ok = (
            not isinstance(self.ks, (str, bytes))
            and bool(self.ks)
            and all(checks.is_int(k) and k >= 1 for k in self.ks)
        )
        checks.raise_problems(
            "EvalSettings",
            [
                checks.int_at_least("num_beams", self.num_beams, 1, flag="--num-beams"),
                checks.int_at_least(
                    "decode_batch_size", self.decode_batch_size, 1, flag="--decode-batch-size"
                ),
                checks.int_at_least("users", self.users, 1, flag="--users", none_ok=True),
                checks.int_at_least("cold_max_count", self.cold_max_count, 0, flag="--cold-max-count"),
                None if ks_ok else f"ks must be positive integers, got {self.ks!r} (--ks)",
                None if checks.is_int(self.seed) else f"seed must be an integer, got {self.seed!r} (--seed)",
            ],
        )
