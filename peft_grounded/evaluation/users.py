"""Which users an evaluation scores, its settings, and the most-popular reference on the same users.

For each part (``valid``, ``test``) a seeded sample of users gives the "all" metrics, and a seeded sample
of as many users whose target is a cold item gives the "cold" ones (cold targets are rare: a sample of
all users would hold few of them). Both samples are scored together (see :func:`~.evaluator.evaluate`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from .evaluate import Results
from .metrics import DEFAULT_KS


@dataclass
class EvalSettings:
    """How many users, which cut-offs, and how to decode."""

    ks: tuple[int, ...] = DEFAULT_KS
    users: int | None = None  # per part, a seeded sample (None: every user)
    seed: int = 0
    num_beams: int = 20
    batch_size: int = 16
    cold_max_count: int = 1  # cold item: a target seen at most this often as a training target
    cold: bool = True
    bf16: bool = False  # decode under bf16 autocast
    new_item_share: float | None = None  # new-item slots (decoding.mix_new_items) for a grown index
    match_levels: int | None = None  # prefix codes a new item must share (None: all levels but the last)

    def __post_init__(self) -> None:
        problems = []
        for name in ("num_beams", "batch_size"):
            value = getattr(self, name)
            if not _positive_int(value):
                problems.append(f"{name} must be a positive integer, got {value!r}")
        if self.users is not None and not _positive_int(self.users):
            problems.append(f"users must be a positive integer or None (every user), got {self.users!r}")
        if (
            not isinstance(self.cold_max_count, int)
            or isinstance(self.cold_max_count, bool)
            or self.cold_max_count < 0
        ):
            problems.append(f"cold_max_count must be an integer >= 0, got {self.cold_max_count!r}")
        if isinstance(self.ks, (str, bytes)) or not self.ks or not all(_positive_int(k) for k in self.ks):
            problems.append(f"ks must be positive integers, got {self.ks!r}")
        if self.new_item_share is not None and not (
            isinstance(self.new_item_share, (int, float)) and 0 <= self.new_item_share <= 1
        ):
            problems.append(
                f"new_item_share must be a fraction between 0 and 1 or None, got {self.new_item_share!r}"
            )
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            problems.append(f"seed must be an integer, got {self.seed!r}")
        if problems:
            raise ValueError("EvalSettings: " + "; ".join(problems))


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


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
            cold_pool = sampled_users(split, part, settings, split.cold_items(settings.cold_max_count), None)[2]
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


def rank_metrics(ranks: Sequence[int | None], ks: Sequence[int]) -> dict[str, float | int | None]:
    """Mean Recall@K and NDCG@K from 0-based target ranks (``None``: absent), as
    :func:`~.metrics.ranking_metrics` computes them from ranked lists, plus ``users``."""
    ks = sorted(set(ks))
    n = len(ranks)
    result: dict[str, float | int | None] = {}
    for k in ks:
        result[f"recall@{k}"] = sum(1 for r in ranks if r is not None and r < k) / n if n else None
    for k in ks:
        gains = [1.0 / math.log2(r + 2) for r in ranks if r is not None and r < k]
        result[f"ndcg@{k}"] = math.fsum(gains) / n if n else None
    result["users"] = n
    return result


def item_token_ids(tokenizer: Any, index: Any) -> dict[str, list[int]]:
    """Item id -> the token ids of its SID, for the constrained decoding."""
    from ..decoding import sid_token_ids

    return sid_token_ids(tokenizer, {item: index.sid_text(item) for item in index.item_ids})
