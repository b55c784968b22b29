"""Full fine-tuning of the base's decoder blocks: the reference row of a recipe comparison.

Instead of a stacked LoRA, every weight of the base's decoder blocks trains, at its own learning rate (full
fine-tuning needs a far lower one than a LoRA or the new rows), in a separate optimizer group that follows the
same schedule; the new rows still train through the grounded adapter at the SFT learning rate. The blocks are
not part of the adapter, so such a run is decoded in place: it neither resumes nor keeps its best checkpoint
(:class:`~.budget.Budget` and the runner refuse both), and LoRA stacking stays the package's documented path.
"""

from __future__ import annotations

import torch
from transformers import TrainerCallback


def decoder_blocks(model) -> torch.nn.ModuleList:
    """The decoder blocks of a (PEFT-wrapped) causal LM: ``<base>.model.layers`` (Llama, Qwen, Mistral, ...)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    blocks = getattr(getattr(base, "model", None), "layers", None)
    if not isinstance(blocks, torch.nn.ModuleList) or not len(blocks):
        raise ValueError(
            f"{type(base).__name__} has no decoder blocks at .model.layers; full fine-tuning of the blocks "
            "supports the decoder-only architectures that keep them there (Llama, Qwen, Mistral, ...)."
        )
    return blocks


def unfreeze_blocks(model) -> list[torch.nn.Parameter]:
    """Make every weight of the decoder blocks trainable; returns them (the embeddings and head stay frozen)."""
    params = list(decoder_blocks(model).parameters())
    for p in params:
        p.requires_grad_(True)
    return params


class BlockLearningRate(TrainerCallback):
    """Move ``params`` into their own optimizer group at ``learning_rate``, on the schedule of the others.

    Runs when training begins (the optimizer and scheduler exist, no step has been taken): the group's rate
    is ``learning_rate`` times the schedule's factor, as every other group's is its own base rate times it.
    """

    def __init__(self, params: list[torch.nn.Parameter], learning_rate: float) -> None:
        if not params:
            raise ValueError("BlockLearningRate needs the parameters it gives their own learning rate.")
        self.params, self.learning_rate = params, learning_rate

    def on_train_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
        if state.global_step:
            raise RuntimeError(
                "full fine-tuning of the blocks does not resume: the blocks are not saved with the adapter; "
                "start the run again in an empty folder."
            )
        ids = {id(p) for p in self.params}
        groups = optimizer.param_groups
        for group in groups:
            group["params"] = [p for p in group["params"] if id(p) not in ids]
        scheduler = getattr(lr_scheduler, "scheduler", lr_scheduler)  # accelerate wraps it
        if not isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):
            raise TypeError(
                f"full fine-tuning of the blocks follows a LambdaLR schedule (transformers' and the time budget's); "
                f"got {type(scheduler).__name__}."
            )
        factor = scheduler.lr_lambdas[0]
        optimizer.add_param_group(
            {
                "params": self.params,
                "lr": self.learning_rate * factor(scheduler.last_epoch),
                "initial_lr": self.learning_rate,
                "weight_decay": groups[0].get("weight_decay", 0.0),
            }
        )
        scheduler.base_lrs.append(self.learning_rate)
        scheduler.lr_lambdas.append(factor)
        return control
