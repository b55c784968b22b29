"""The grounding stage (GTI): train only the new token rows, backbone frozen, through TRL's ``SFTTrainer``.

``GroundingConfig`` / ``GroundingTrainer`` follow TRL's config/trainer pairs. The trainer is an
``SFTTrainer`` that

* wraps the model with a :class:`~peft_grounded.GroundedTokenConfig` when one is given (PEFT conventions);
* refuses anything trainable besides the grounded rows (a LoRA comes after grounding, see ``add_lora``);
* records a run manifest and refuses to resume from, or write next to, checkpoints of another run;
* writes the final adapter atomically and keeps the loss log as JSON.

Checkpoints hold only the new rows (``adapter_model.safetensors``), the optimiser, scheduler and RNG
states: ``train(resume_from_checkpoint=True)`` after a crash ends where an uninterrupted run ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import torch
from peft import PeftModel, get_peft_model

from .._locks import locks_output
from ..adapter import GroundedTokenConfig
from ..training.trainer import RunTrainer, StageRun, run_stage
from .config import GroundingConfig


def _refuse_lora(config: GroundedTokenConfig) -> None:
    if config.has_lora:
        raise ValueError(
            "Grounding trains the new token rows with the backbone frozen; this adapter carries a LoRA. "
            "Ground first, then stack the LoRA with peft_grounded.add_lora for the task's SFT."
        )


def _trainable_names(model) -> list[str]:
    return [n for n, p in model.named_parameters() if p.requires_grad]


class GroundingTrainer(RunTrainer):
    """``SFTTrainer`` for the grounding stage: only the grounded rows train; resumable and run-checked.

    ``rows``: train only these rows of the grounded matrices (incremental grounding of a grown adapter,
    :func:`peft_grounded.growth.ground_new_items`): a gradient mask keeps every other row bit-identical, which
    needs ``weight_decay=0``; a stacked LoRA is then allowed as long as it is frozen.
    """

    stage = "grounding"

    def __init__(
        self,
        model,
        args: GroundingConfig | None = None,
        *,
        peft_config: GroundedTokenConfig | None = None,
        rows: Sequence[int] | None = None,
        **kwargs,
    ) -> None:
        if peft_config is not None:
            _refuse_lora(peft_config)
            if isinstance(model, PeftModel):
                raise ValueError("Pass either a PeftModel or a peft_config, not both.")
            if not isinstance(peft_config, GroundedTokenConfig):
                raise TypeError("GroundingTrainer's peft_config must be a GroundedTokenConfig.")
            model = get_peft_model(model, peft_config)
        if not isinstance(model, PeftModel) or not any(
            isinstance(c, GroundedTokenConfig) for c in model.peft_config.values()
        ):
            raise ValueError(
                "GroundingTrainer needs a model with a grounded-token adapter (or pass peft_config)."
            )
        if rows is None:
            _refuse_lora(model.peft_config[model.active_adapter])
        others = [n for n in _trainable_names(model) if ".grounded_" not in n]
        if others:
            raise ValueError(
                f"Only the new token rows may train during grounding; also trainable: {others[:5]}."
            )
        if not _trainable_names(model):
            raise ValueError("No grounded rows are trainable: load the adapter with is_trainable=True.")
        args = args or GroundingConfig(output_dir="grounding")
        if rows is not None and args.weight_decay:
            raise ValueError(
                f"training only some rows needs weight_decay=0 (decay would move the others), got {args.weight_decay}"
            )
        self.rows = None if rows is None else list(rows)
        super().__init__(model, args, **kwargs)

    def train(self, *args, **kwargs):
        """Train (see :meth:`RunTrainer.train`); with ``rows``, the other rows' gradients are zeroed meanwhile."""
        if self.rows is None:
            return super().train(*args, **kwargs)
        handles = []
        for name, param in self.model.named_parameters():
            if param.requires_grad and ".grounded_" in name:
                mask = torch.zeros(param.shape[0], 1, dtype=torch.bool, device=param.device)
                mask[torch.as_tensor(self.rows, device=param.device)] = True
                handles.append(param.register_hook(partial(_keep_rows, mask)))
        try:
            return super().train(*args, **kwargs)
        finally:
            for handle in handles:
                handle.remove()


def _keep_rows(mask: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """``grad`` with the rows outside ``mask`` zeroed."""
    return grad * mask.to(grad.device, grad.dtype)


@locks_output("args.output_dir", "ground")
def ground(
    catalogue,
    index,
    args: GroundingConfig,
    *,
    model_path: str | None = None,
    init: str = "mean",
    centroid_variant: str = "items",
    init_scale: float = 1.0,
    max_examples: int | None = None,
    resume: bool = False,
    model: PeftModel | None = None,
    tokenizer=None,
    dtype: torch.dtype = torch.float32,
    callbacks: list | None = None,
) -> PeftModel:
    """Ground the adapter for ``index``'s tokens on ``catalogue``'s text (the ``ground`` command).

    A fresh base model (``model_path``, default: the packaged SmolLM2-135M, loaded in ``dtype``) gets the tokens and ``init``
    starts their rows; or ``model`` (with its ``tokenizer``), a model already wrapped for ``index``, is
    grounded in place (the strategy runner's path). Only the rows train, on the six GTI templates; the
    adapter lands in ``<args.output_dir>/adapter``. The output folder is locked from the start, before the
    model is loaded.
    """
    from .data import grounding_dataset

    run = StageRun(model, tokenizer, max_examples, callbacks, resume)
    start = {"model_path": model_path, "init": init, "centroid_variant": centroid_variant}
    start |= {"init_scale": init_scale, "dtype": dtype}
    data = partial(grounding_dataset, catalogue, index)
    return run_stage(GroundingTrainer, index, args, run, data, caller="ground", **start)
