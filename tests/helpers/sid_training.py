"""A tiny SID recommender ready for RecommendationTrainer: the toy catalogue's SID tokens added to a tiny model
under a grounded-token adapter (and a LoRA if asked), its sequence-objective training rows, and the trainer's
settings for a few-step CPU run."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from conftest import build_tiny_model


@dataclass
class SIDTraining:
    model: Any
    tokenizer: Any
    data: Any


def sid_training(
    tokenizer: Any,
    arch: str = "llama",
    tied: bool = True,
    lora_rank: int = 0,
    dtype: torch.dtype | None = None,
) -> SIDTraining:
    """A fresh copy of ``tokenizer`` and a tiny ``arch`` model with the toy catalogue's SID tokens under a
    grounded-token adapter (plus a rank-``lora_rank`` LoRA on every linear layer; ``dtype``: the base's), and the
    sequence-objective rows of the toy catalogue's training split."""
    from peft import get_peft_model

    import peft_grounded
    from helpers.toy_catalogue import toy_catalogue, toy_index
    from peft_grounded import GroundedTokenConfig
    from peft_grounded.adapter import add_lora
    from peft_grounded.prompts import PromptFormat
    from peft_grounded.training.sft import training_dataset

    catalogue = toy_catalogue()
    index = toy_index(catalogue)
    tokenizer = copy.deepcopy(tokenizer)
    base = build_tiny_model(arch, tied)
    ids = peft_grounded.add_tokens(tokenizer, base, index.token_strings)
    if dtype is not None:
        base = base.to(dtype)
    model = get_peft_model(base, GroundedTokenConfig(token_indices=ids, task_type="CAUSAL_LM"))
    if lora_rank:
        add_lora(model, r=lora_rank, lora_alpha=2 * lora_rank, target_modules="all-linear")
    fmt = PromptFormat(objective="sequence", max_history=3)
    data = training_dataset(catalogue.leave_one_out(), index, catalogue, tokenizer, fmt)
    return SIDTraining(model, tokenizer, data)


def trainer_args(output_dir: Path, **changes: Any) -> Any:
    """RecommendationConfig for a 3-step float32 CPU run in ``output_dir`` (``changes`` override)."""
    from peft_grounded.training.stage_config import RecommendationConfig

    settings = dict(
        output_dir=str(output_dir), per_device_train_batch_size=4, max_steps=3, use_cpu=True, report_to="none",
        disable_tqdm=True, save_steps=1000, bf16=False, max_length=64, logging_steps=1, seed=0,
    )  # fmt: skip
    return RecommendationConfig(**(settings | changes))
