"""A base model extended with a SID index's tokens and wrapped with a grounded adapter, fresh or saved."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import torch

from ..prompts import PromptFormat


def load_base(model_path: str, dtype: torch.dtype = torch.float32):
    """A fresh tokenizer and base model from a local checkpoint (safetensors only)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype, use_safetensors=True)
    return tokenizer, model


def sid_model(
    model_path: str,
    index: Any,
    *,
    init: str = "mean",
    centroid_variant: str = "items",
    seed: int = 0,
    fmt: PromptFormat | None = None,
    adapter: str | None = None,
    is_trainable: bool = True,
    dtype: torch.dtype = torch.float32,
):
    """``(tokenizer, PeftModel)``: the base with ``index``'s tokens and a grounded adapter.

    With ``adapter`` (a saved grounded adapter), its rows (and LoRA) are loaded after checking that it was
    made for this index; otherwise a fresh adapter starts from ``init`` (``centroid``: the index's
    ``centroid_variant`` centroids). The config records the index fingerprint and the prompt format.
    """
    from peft import PeftModel, get_peft_model

    from . import GroundedTokenConfig, add_tokens

    tokenizer, base = load_base(model_path, dtype)
    added = add_tokens(tokenizer, base, index.token_strings)
    if adapter is not None:
        model = PeftModel.from_pretrained(base, adapter, is_trainable=is_trainable)
        index.check_adapter(model.peft_config[model.active_adapter])
        return tokenizer, model
    vectors = None
    if init == "centroid":
        tokens, vectors = index.adapter_init(centroid_variant)
        if tokens != added.tokens:
            raise ValueError("The SID index's token order differs from the tokens added to the model.")
    config = GroundedTokenConfig(
        token_indices=added,
        init=init,
        init_vectors=vectors,
        init_seed=seed,
        task_type="CAUSAL_LM",
        metadata={
            "sid_index_fingerprint": index.fingerprint(),
            "prompt_format": asdict(fmt or PromptFormat()),
        },
    )
    return tokenizer, get_peft_model(base, config)


def base_model_path(adapter: str) -> str:
    """The local base model of a saved adapter: its recorded base if that is a directory here, else the
    packaged SmolLM2-135M when the adapter was made on it."""
    from pathlib import Path

    from peft import PeftConfig

    from .. import assets

    recorded = PeftConfig.from_pretrained(adapter).base_model_name_or_path or ""
    if recorded and Path(recorded).is_dir():
        return recorded
    local = assets.smollm2()
    if recorded in ("", str(local)) or "smollm2" in recorded.lower():
        return str(local)
    raise FileNotFoundError(
        f"The adapter at {adapter} was made on {recorded!r}, which is not a local directory: pass its path "
        "(model_path= / --model)."
    )


def prompt_format_of(model, default: PromptFormat | None = None) -> PromptFormat:
    """The prompt format recorded in the model's adapter config (else ``default`` or the standard one)."""
    recorded = getattr(model.peft_config[model.active_adapter], "prompt_format", None)
    if recorded:
        return PromptFormat(**recorded)
    return default or PromptFormat()


def model_for(
    index: Any,
    model: Any = None,
    tokenizer: Any = None,
    *,
    model_path: str | None = None,
    caller: str,
    **kwargs,
):
    """``(tokenizer, model)`` for a training entry point: the live ``model`` it was given (already wrapped for
    ``index``; it needs its ``tokenizer``), or a fresh :func:`sid_model` of ``model_path`` (default: the
    packaged SmolLM2-135M) with ``kwargs``."""
    if model is None:
        from .. import assets

        return sid_model(model_path or str(assets.smollm2()), index, **kwargs)
    if tokenizer is None:
        raise ValueError(
            f"{caller}(model=...) needs the model's tokenizer (with the SID tokens): pass tokenizer=."
        )
    return tokenizer, model
