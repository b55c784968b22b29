"""Recommendation SFT: the LoRA-stacked grounded adapter learns next-item SIDs, through TRL's ``SFTTrainer``."""

from __future__ import annotations

from dataclasses import asdict
from functools import partial

import torch
from peft import PeftModel

from .._locks import locks_output
from ..adapter import GroundedTokenConfig
from ..adapter.loading import SID_SOFTMAX_KEY
from ..prompts import PromptFormat
from ..training.trainer import RunTrainer, StageRun, run_stage
from .callbacks import ValidationRecall
from .config import RecommendationConfig

__all__ = ["RecommendationConfig", "RecommendationTrainer", "ValidationRecall", "train_recommender"]


class RecommendationTrainer(RunTrainer):
    """``SFTTrainer`` for next-item SFT on a grounded adapter (usually with a LoRA from ``add_lora``)."""

    stage = "recommendation"

    def __init__(self, model, args: RecommendationConfig | None = None, **kwargs) -> None:
        from ..peers.peft_default import is_peft_default

        grounded = isinstance(model, PeftModel) and isinstance(
            model.peft_config.get(model.active_adapter), GroundedTokenConfig
        )
        if not (grounded or is_peft_default(model)):
            raise ValueError(
                "RecommendationTrainer trains a grounded-token adapter: wrap the model with GroundedTokenConfig "
                "(and stack a LoRA with peft_grounded.add_lora) first. (A PEFT LoraConfig with "
                "trainable_token_indices, the baseline of peft_grounded.peers, is accepted too.)"
            )
        args = args or RecommendationConfig(output_dir="recommendation")
        if not grounded:
            args.compact_loss = False  # the compact head is this package's; the baseline keeps TRL's
        super().__init__(model, args, **kwargs)

    def _grounded(self) -> bool:
        return isinstance(self.model.peft_config.get(self.model.active_adapter), GroundedTokenConfig)

    def _sid_softmax_problem(self) -> str | None:
        if not self._grounded():
            return "a grounded adapter's SID rows (this model carries PEFT's own LoRA with trainable_token_indices)"
        return super()._sid_softmax_problem()

    def record_sid_softmax(self, on: bool) -> None:
        if self._grounded():
            record_sid_softmax(self.model, on)


def record_sid_softmax(model, on: bool) -> None:
    """Write the normalisation the adapter trains under into its metadata (``sid_softmax: true``; absent:
    the full vocabulary, as every adapter before it), before the run manifest fingerprints the config."""
    config = model.peft_config[model.active_adapter]
    metadata = {k: v for k, v in (config.metadata or {}).items() if k != SID_SOFTMAX_KEY}
    if on:
        metadata[SID_SOFTMAX_KEY] = True
    config.metadata = metadata if metadata or config.metadata is not None else None


@locks_output("args.output_dir", "sft")
def train_recommender(
    catalogue,
    index,
    args: RecommendationConfig,
    *,
    model_path: str | None = None,
    grounded: str | None = None,
    init: str = "mean",
    centroid_variant: str = "items",
    init_scale: float = 1.0,
    lora: dict | bool | None = None,
    fmt: PromptFormat | None = None,
    max_examples: int | None = None,
    resume: bool = False,
    model: PeftModel | None = None,
    tokenizer=None,
    split=None,
    callbacks: list | None = None,
    dtype: torch.dtype = torch.float32,
) -> PeftModel:
    """Next-item SFT with a LoRA stacked on the new rows (the ``sft`` command).

    The rows start from the grounded adapter at ``grounded`` (checked against ``index``) or from ``init``
    on a fresh base (``model_path`` loaded in ``dtype``); or ``model`` (with its ``tokenizer``), a model
    already wrapped for ``index`` (the strategy runner's path), trains in place. ``lora`` holds
    :func:`~peft_grounded.add_lora`'s arguments (False: no LoRA; the rows, and any weight the caller made
    trainable, train); every adapter weight trains in float32. The rows follow
    ``fmt.objective`` (see :func:`~.data.training_dataset`) on ``split`` (default: the catalogue's
    leave-one-out split), and ``fmt`` is recorded in the adapter. Writes ``<args.output_dir>/adapter``
    (the folder is locked from the start, before the model is loaded).
    """
    from ..adapter import add_lora
    from ..adapter.lora import lora_settings
    from .augmentation import Augmentation
    from .data import training_dataset

    stack = lora is not False  # False: no LoRA (the rows, and what the caller unfroze, train)
    lora_given = bool(lora)
    lora = lora_settings(**(lora or {}))  # checked before the model loads
    fmt = fmt or PromptFormat()
    split = split if split is not None else catalogue.leave_one_out()

    def stack_lora(model: PeftModel) -> None:
        config = model.peft_config[model.active_adapter]
        if isinstance(config, GroundedTokenConfig):
            config.metadata = {**(config.metadata or {}), "prompt_format": asdict(fmt)}
            if stack:
                add_lora(model, **lora)
        elif lora_given:
            raise ValueError(
                "lora= stacks a LoRA on a grounded adapter; this model carries PEFT's own LoRA already"
            )

    run = StageRun(model, tokenizer, max_examples, callbacks, resume)
    start = {"model_path": model_path, "init": init, "centroid_variant": centroid_variant}
    start |= {"init_scale": init_scale, "dtype": dtype}
    data = partial(training_dataset, split, index, catalogue, fmt=fmt, augment=Augmentation.of(args))
    start |= {"caller": "train_recommender", "fmt": fmt, "adapter": grounded}
    return run_stage(RecommendationTrainer, index, args, run, data, stack_lora, **start)
