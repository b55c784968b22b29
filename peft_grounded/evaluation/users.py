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
from typing import Any

import torch

from .metrics import rank_metrics
from .reports import Results
from .settings import EvalSettings


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


def item_token_ids(tokenizer: Any, index: Any) -> dict[str, list[int]]:
    """Item id -> the token ids of its SID, for the constrained decoding."""
    from ..decoding import sid_token_ids

    return sid_token_ids(tokenizer, {item: index.sid_text(item) for item in index.item_ids})
