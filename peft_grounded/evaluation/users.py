"""Evaluate a SID recommender on the users of a leave-one-out split: the one entry point the runner, the
CLI and scripts share.

For each part (``valid``, ``test``) a seeded sample of users gives the "all" metrics, and a seeded sample
of as many users whose target is a cold item gives the "cold" ones (cold targets are rare: a sample of
all users would hold few of them). Both samples are decoded together with the SID-constrained beam search.
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
from .metrics import DEFAULT_KS, ranking_metrics


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


def _sample(items: list, n: int | None, seed: int) -> list:
    return list(items) if n is None or n >= len(items) else random.Random(seed).sample(items, n)


def _users(split: Any, part: str, settings: EvalSettings, cold_items: set[str], max_history: int | None):
    """The part's sampled users, its sampled cold-target users, and all its cold-target users."""
    examples = list(getattr(split, f"{part}_examples")(max_history))
    chosen = _sample(examples, settings.users, settings.seed)
    cold_pool = [e for e in examples if e[2] in cold_items] if settings.cold else []
    return chosen, _sample(cold_pool, settings.users, settings.seed), cold_pool


def _part_prompts(split, part, settings, cold_items, index, tokenizer, catalogue, fmt):
    """:func:`_users` of a part, plus the prompts of every user either sample holds (each once)."""
    from ..prompts import inference_prompts

    chosen, cold_chosen, cold_pool = _users(split, part, settings, cold_items, fmt.max_history)
    todo = list({e[0]: e for e in chosen + cold_chosen}.values())
    return (chosen, cold_chosen, cold_pool), inference_prompts(todo, index, tokenizer, catalogue, fmt)


def _autocast(model: Any, settings: EvalSettings):
    device = next(model.parameters()).device.type
    return torch.autocast(device, dtype=torch.bfloat16) if settings.bf16 else nullcontext()


POPULARITY_LABEL = "popularity (reference, no model)"  # its row name in comparison tables


def evaluate_popularity(
    split: Any,
    parts: tuple[str, ...] = ("valid", "test"),
    settings: EvalSettings | None = None,
    items: Sequence[str] | None = None,
) -> Results:
    """The most-popular reference on the users :func:`evaluate_model` samples with the same ``settings``:
    every user gets the items most often a training target, best first (no model, no history).

    With the catalogue's ``items`` it also gives ``constrained_nll``: ``-log p(target)`` under the
    add-one-smoothed target frequencies, the likelihood reference of
    :func:`~peft_grounded.evaluation.likelihood.evaluate_likelihood`. A recommender that does not beat
    these has learnt popularity at best; cold targets score ~0 on the ranking metrics by design.
    """
    settings = settings or EvalSettings()
    counts = split.training_target_counts()
    top = [item for item, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[: max(settings.ks)]]
    if len(top) < max(settings.ks):
        raise ValueError(
            f"only {len(top)} distinct training targets, fewer than K={max(settings.ks)}: lower the ks"
        )
    if items is not None:
        unknown = set(counts) - set(items)
        if unknown:
            raise ValueError(
                f"{len(unknown)} training targets (e.g. {sorted(unknown)[:3]}) are not among the given items: "
                "pass every catalogue item"
            )
        denominator = sum(counts.values()) + len(set(items))
    cold_items = split.cold_items(settings.cold_max_count)

    def scored(examples: list) -> dict[str, float | int | None]:
        metrics = ranking_metrics([top] * len(examples), [e[2] for e in examples], settings.ks)
        if items is not None:
            nll = [-math.log((counts[e[2]] + 1) / denominator) for e in examples]
            metrics["constrained_nll"] = math.fsum(nll) / len(nll) if nll else None
        return metrics

    results: Results = {}
    for part in parts:
        chosen, cold_chosen, cold_pool = _users(split, part, settings, cold_items, None)
        results[part] = {"all": scored(chosen)}
        if settings.cold:
            results[part]["cold"] = scored(cold_chosen) | {"cold_users_available": len(cold_pool)}
    return results


def item_token_ids(tokenizer: Any, index: Any) -> dict[str, list[int]]:
    """Item id -> the token ids of its SID, for the constrained decoding."""
    from ..decoding import sid_token_ids

    return sid_token_ids(tokenizer, {item: index.sid_text(item) for item in index.item_ids})


def evaluate_model(
    model: Any,
    tokenizer: Any,
    split: Any,
    index: Any,
    catalogue: Any = None,
    fmt: Any = None,
    parts: tuple[str, ...] = ("valid", "test"),
    settings: EvalSettings | None = None,
    trie: Any = None,
) -> Results:
    """``{part: {"all": metrics, "cold": metrics, "decoding": counters}}`` for the split's users."""
    from ..decoding import SIDTrie, recommend
    from ..prompts import PromptFormat

    settings = settings or EvalSettings()
    fmt = fmt or PromptFormat()
    trie = trie or SIDTrie(item_token_ids(tokenizer, index))
    cold_items = split.cold_items(settings.cold_max_count)
    results: Results = {}
    for part in parts:
        (chosen, cold_chosen, cold_pool), (users, prompts, _) = _part_prompts(
            split, part, settings, cold_items, index, tokenizer, catalogue, fmt
        )
        with _autocast(model, settings):
            recs = recommend(
                model,
                tokenizer,
                prompts,
                trie,
                k=max(settings.ks),
                num_beams=max(settings.num_beams, max(settings.ks)),
                batch_size=settings.batch_size,
            )
        ranked = dict(zip(users, recs.items, strict=True))
        results[part] = {
            "all": ranking_metrics([ranked[e[0]] for e in chosen], [e[2] for e in chosen], settings.ks),
            "decoding": recs.stats(),
        }
        if settings.cold:
            cold = ranking_metrics(
                [ranked[e[0]] for e in cold_chosen], [e[2] for e in cold_chosen], settings.ks
            )
            results[part]["cold"] = cold | {"cold_users_available": len(cold_pool)}
    return results


def evaluate_adapter(
    adapter: str,
    index: Any,
    catalogue: Any,
    settings: EvalSettings | None = None,
    *,
    model_path: str | None = None,
    fmt: Any = None,
    parts: tuple[str, ...] = ("valid", "test"),
) -> Results:
    """Load a trained adapter onto its base (checked against ``index``) and :func:`evaluate_model` it, with the
    prompt format recorded in the adapter unless ``fmt`` is given."""
    from ..models import base_model_path, prompt_format_of, sid_model

    settings = settings or EvalSettings()
    dtype = torch.bfloat16 if settings.bf16 else torch.float32
    tokenizer, model = sid_model(
        model_path or base_model_path(adapter), index, adapter=adapter, is_trainable=False, dtype=dtype
    )
    return evaluate_model(
        model,
        tokenizer,
        catalogue.leave_one_out(),
        index,
        catalogue,
        fmt or prompt_format_of(model),
        parts,
        settings,
    )
