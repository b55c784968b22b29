"""Recommendation SFT: the LoRA-stacked grounded adapter learns next-item SIDs, through TRL's ``SFTTrainer``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from peft import PeftModel
from transformers import TrainerCallback

from ..adapter import GroundedTokenConfig
from ..prompts import PromptFormat
from ..training import RunConfig, RunTrainer


@dataclass
class RecommendationConfig(RunConfig):
    """``RunConfig`` with the recommendation stage's defaults (LoRA + new rows, loss on the SID only)."""

    learning_rate: float = field(
        default=5e-4, metadata={"help": "Learning rate of the LoRA and the new rows."}
    )


class RecommendationTrainer(RunTrainer):
    """``SFTTrainer`` for next-item SFT on a grounded adapter (usually with a LoRA from ``add_lora``)."""

    stage = "recommendation"

    def __init__(self, model, args: RecommendationConfig | None = None, **kwargs) -> None:
        if not isinstance(model, PeftModel) or not isinstance(
            model.peft_config.get(model.active_adapter), GroundedTokenConfig
        ):
            raise ValueError(
                "RecommendationTrainer trains a grounded-token adapter: wrap the model with GroundedTokenConfig "
                "(and stack a LoRA with peft_grounded.add_lora) first."
            )
        super().__init__(model, args or RecommendationConfig(output_dir="recommendation"), **kwargs)


class ValidationRecall(TrainerCallback):
    """Every ``every`` steps, decode the validation prompts and log Recall@K / NDCG@K (``eval_recall@5``...).

    The points are also kept in ``state.log_history``, which checkpoints store: a resumed run starts its
    ``curve`` from the points logged before the checkpoint, so it ends with the whole curve.
    """

    def __init__(self, evaluate, every: int) -> None:
        self.evaluate, self.every = evaluate, every
        self.curve: list[dict] = []

    def on_train_begin(self, args, state, control, **kwargs):
        self.curve = [
            {
                "step": entry["step"],
                **{k[len("eval_") :]: v for k, v in entry.items() if k.startswith("eval_")},
            }
            for entry in state.log_history
            if "step" in entry and any(k.startswith("eval_recall@") for k in entry)
        ]
        return control

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self.every and state.global_step % self.every == 0 and state.is_world_process_zero:
            metrics = self.evaluate(model)
            self.curve.append({"step": state.global_step, **metrics})
            state.log_history.append(
                {"step": state.global_step, **{f"eval_{k}": v for k, v in metrics.items()}}
            )
        return control


def train_recommender(
    catalogue,
    index,
    args: RecommendationConfig,
    *,
    model_path: str | None = None,
    grounded: str | None = None,
    init: str = "mean",
    centroid_variant: str = "items",
    lora: dict | None = None,
    fmt: PromptFormat | None = None,
    max_examples: int | None = None,
    resume: bool = False,
) -> PeftModel:
    """Next-item SFT with a LoRA stacked on the new rows (the ``sft`` command).

    The rows start from the grounded adapter at ``grounded`` (checked against ``index``) or from ``init``;
    ``lora`` holds :func:`~peft_grounded.add_lora`'s arguments. Writes ``<args.output_dir>/adapter``.
    """
    from .. import assets
    from ..adapter import add_lora
    from ..models import sid_model
    from ..training import sample_rows
    from .data import training_dataset

    fmt = fmt or PromptFormat()
    tokenizer, model = sid_model(
        model_path or str(assets.smollm2()),
        index,
        init=init,
        centroid_variant=centroid_variant,
        seed=args.seed,
        fmt=fmt,
        adapter=grounded,
    )
    if grounded is not None:
        model.peft_config[model.active_adapter].prompt_format = asdict(fmt)
    add_lora(model, **(lora or {}))
    data = sample_rows(
        training_dataset(catalogue.leave_one_out(), index, catalogue, tokenizer, fmt), max_examples, args.seed
    )
    trainer = RecommendationTrainer(model, args, train_dataset=data, processing_class=tokenizer)
    trainer.train(resume_from_checkpoint=True if resume else None)
    return model
