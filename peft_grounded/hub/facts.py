"""Model-card facts derived from an adapter's config and its SID index, merged with the user's own."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..sids.tokens import DEFAULT_TEMPLATE, level_name, sid_vocabulary
from .card import GroundedCardFacts

if TYPE_CHECKING:
    from ..adapter import GroundedTokenConfig
    from ..sids.index import SIDIndex

INIT_DESCRIPTIONS = {
    "mean": "the mean of the base vocabulary's rows",
    "gaussian": "draws from a Gaussian fitted to the base vocabulary's rows",
    "random": "the model's own random initialiser",
    "description": "per token, the mean embedding of a text describing it",
    "centroid": "per-token centroids of the items' text embeddings, projected to the model's width",
    "tensor": "given vectors",
    "adapter": "the rows of another grounded adapter",
    "keep": "the rows the base held (a no-op start)",
}


def init_facts(config: GroundedTokenConfig) -> dict[str, Any]:
    if not config.init_weights:  # PEFT's meaning: random rows, whatever `init` says
        return {"name": "randn", "description": "random rows, torch.randn (init_weights=False)", "params": {}}
    params: dict[str, Any] = {}
    if config.init in ("gaussian", "random"):
        params["seed"] = config.init_seed
    if config.init == "centroid":
        params |= {"projection": config.centroid_projection, "norm_match": config.norm_match}
    if config.init_scale != 1.0 and config.init != "adapter":
        params["init_scale"] = config.init_scale
    return {"name": config.init, "description": INIT_DESCRIPTIONS.get(config.init), "params": params}


def lora_facts(config: GroundedTokenConfig) -> dict[str, Any] | None:
    """The stacked LoRA's settings for the card (r, alpha, dropout and targets first, other options after)."""
    if config.lora is None:
        return None
    lora = dict(config.lora)
    main = {
        "r": lora.pop("r", 8),  # peft.LoraConfig's default rank
        "lora_alpha": lora.pop("lora_alpha", 8),
        "lora_dropout": lora.pop("lora_dropout", 0.0),
        "target_modules": lora.pop("target_modules"),
    }
    return main | lora


def codes_from_tokens(tokens: list[str]) -> list[int] | None:
    """``codes_per_level`` if ``tokens`` are exactly a default-template SID vocabulary (``<a_0>`` ...)."""
    levels: Counter[str] = Counter(t[1 : t.index("_")] for t in tokens if t.startswith("<") and "_" in t)
    codes = []
    while level_name(len(codes)) in levels:
        codes.append(levels[level_name(len(codes))])
    try:
        return codes if codes and sid_vocabulary(codes, DEFAULT_TEMPLATE) == tokens else None
    except ValueError:
        return None


def sid_facts(
    config: GroundedTokenConfig, index: SIDIndex | None, index_pointer: str | None
) -> dict[str, Any] | None:
    if index is None:
        codes = codes_from_tokens(list(config.token_strings or []))
        if codes is None:
            return None
        return {"codes_per_level": codes, "num_new_tokens": len(config.token_indices), "index": index_pointer}
    text = index.text_template or {}
    return {
        "codes_per_level": list(index.codes_per_level),
        "token_template": index.token_template,
        "num_new_tokens": len(config.token_indices),
        "quantiser": "RQ-KMeans" + (" + a disambiguation level" if index.disambiguation_level else ""),
        "encoder": index.encoder.get("model"),
        "text_template": f"fields: {', '.join(text['fields'])}" if text.get("fields") else None,
        "index": index_pointer,
    }


def derive_card_facts(
    config: GroundedTokenConfig,
    *,
    base_model: str,
    repo_id: str,
    index: SIDIndex | None = None,
    index_pointer: str | None = None,
    overrides: GroundedCardFacts | Mapping[str, Any] | None = None,
) -> GroundedCardFacts:
    """What the adapter says about itself (base, SID scheme, initialisation, LoRA), then ``overrides`` on top
    (a mapping replaces whole entries; a :class:`GroundedCardFacts` is used as given, its repo id filled in)."""
    if isinstance(overrides, GroundedCardFacts):
        return dataclasses.replace(overrides, repo_id=overrides.repo_id or repo_id)
    facts: dict[str, Any] = {
        "base_model": base_model,
        "repo_id": repo_id,
        "sid": sid_facts(config, index, index_pointer),
        "init": init_facts(config),
        "lora": lora_facts(config),
    }
    return GroundedCardFacts.from_dict({**facts, **dict(overrides or {})})
