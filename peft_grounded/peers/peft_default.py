"""The path a user has without this package: ``resize_token_embeddings(mean_resizing=True)`` and PEFT's own
``LoraConfig(trainable_token_indices=...)``, trained by the same recommendation SFT at the same budget.

transformers' ``mean_resizing`` starts every new row at a draw from N(mean, 1e-9 * cov) of the old rows,
which is the vocabulary mean in practice (the GTI paper's baseline); PEFT's trainable tokens then train a
delta on those rows (tied heads follow the input rows) next to the LoRA.
"""

from __future__ import annotations

from typing import Any

import torch

PEFT_DEFAULT = "peft_default"  # the strategy name of this path in the experiment runner


def peft_default_model(
    model_path: str,
    index: Any,
    lora: dict[str, Any],
    *,
    dtype: torch.dtype = torch.float32,
):
    """``(tokenizer, PeftModel)``: ``index``'s tokens added the plain way, rows mean-resized, and a PEFT
    ``LoraConfig`` (``lora``: its arguments) whose ``trainable_token_indices`` are the new tokens."""
    from peft import LoraConfig, get_peft_model

    from ..sids.model import load_base

    tokenizer, base = load_base(model_path, dtype)
    tokens = list(index.token_strings)
    tokenizer.add_tokens(tokens, special_tokens=False)
    base.resize_token_embeddings(len(tokenizer), mean_resizing=True)
    ids = tokenizer.convert_tokens_to_ids(tokens)
    if len(set(ids)) != len(tokens) or tokenizer.unk_token_id in ids:
        raise ValueError("some SID tokens did not become single new tokens of the tokenizer")
    config = LoraConfig(
        task_type="CAUSAL_LM",
        trainable_token_indices={"embed_tokens": ids},
        **lora,
    )
    return tokenizer, get_peft_model(base, config)


def is_peft_default(model: Any) -> bool:
    """Whether ``model`` is a PEFT LoRA model training new tokens through ``trainable_token_indices``."""
    from peft import LoraConfig

    config = getattr(model, "peft_config", {}).get(getattr(model, "active_adapter", None))
    return isinstance(config, LoraConfig) and bool(config.trainable_token_indices)
