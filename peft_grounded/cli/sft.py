"""``peft-grounded sft``: recommendation SFT (LoRA + the new rows) from the command line
(:func:`peft_grounded.training.sft.train_recommender`).

The flags are the fields of :class:`~.common.DataArguments`, :class:`~peft_grounded.sids.extended_base.RowStart` (how
the new rows start), :class:`~.common.SFTArguments`, :class:`~.model_config.LoraModelConfig` (TRL's
``ModelConfig``: the base model and the LoRA) and :class:`~peft_grounded.training.sft.RecommendationConfig`
(TRL's ``SFTConfig``), parsed by TRL's parser; ``--config sft.yaml`` gives any of them. The parsed ``RowStart``
is passed down as it is, to the model it starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .common import Command, DataArguments, SFTArguments

if TYPE_CHECKING:
    from ..sids.extended_base import RowStart
    from .model_config import LoraModelConfig

DESCRIPTION = (
    "Start the new rows from a grounded adapter (--grounded) or a fresh initialisation (--init), stack a LoRA, "
    "and train next-item SFT on the catalogue's leave-one-out training histories. Writes OUTPUT_DIR/adapter "
    "(rows + LoRA, one artefact). --recipe NAME: a named recipe's settings as defaults (see --recipe). "
    "Every flag is a field of DataArguments, RowStart (how the new rows start), SFTArguments, ModelConfig "
    "(TRL's: the base model and the LoRA) or RecommendationConfig (TRL's SFTConfig)."
)


def settings() -> tuple[type, ...]:
    from ..sids.extended_base import RowStart
    from ..training.stage_config import RecommendationConfig
    from .model_config import LoraModelConfig

    return (DataArguments, RowStart, SFTArguments, LoraModelConfig, RecommendationConfig)


def run(data: DataArguments, start: RowStart, sft: SFTArguments, base: LoraModelConfig, config: Any) -> int:
    """Train the recommender as the settings say; the same call serves the command line, YAML and Python."""
    from ..training.sft.recommendation_trainer import train_recommender

    catalogue, index = data.load()
    fmt, split = sft.prompt_format(), catalogue.leave_one_out()  # one split: training and its validation
    train_recommender(
        catalogue,
        index,
        config,
        model_path=base.model_path(config.output_dir),
        grounded=sft.grounded,
        start=start,
        lora=base.lora(),
        fmt=fmt,
        max_examples=data.max_examples,
        dtype=base.torch_dtype(),
        split=split,
        callbacks=validation_callbacks(catalogue, index, split, fmt, sft, config),
    )
    print(f"recommender adapter: {config.output_dir}/adapter")
    return 0


def validation_callbacks(
    catalogue: Any, index: Any, split: Any, fmt: Any, sft: SFTArguments, config: Any
) -> list:
    """``--eval_every`` / ``--eval_per_epoch`` / ``--keep_best``: the validation users decoded during training as
    ``evaluate`` decodes them (the served route, the history left out), every ``eval_every`` steps or
    ``eval_per_epoch`` times an epoch; none when both are 0."""
    if not sft.eval_every and not sft.eval_per_epoch:
        return []
    from pathlib import Path

    from ..evaluation import EvalSettings, evaluate
    from ..training.callbacks import ValidationRecall

    settings = EvalSettings(users=sft.eval_users, seed=config.seed + 1, ks=[5, 10], cold=False)

    def recall(model: Any, tokenizer: Any) -> dict:
        result = evaluate(
            model, tokenizer, split, index, catalogue, fmt, ("valid",), settings, likelihood=False
        )
        return result.metrics["valid"]["all"]

    return [
        ValidationRecall(
            recall,
            sft.eval_every,
            keep_best="recall@10" if sft.keep_best else None,
            directory=Path(config.output_dir) / "best",
            with_tokenizer=True,
            per_epoch=sft.eval_per_epoch,
        )
    ]


COMMAND = Command(
    name="sft",
    help="train the recommender: next-item SID prediction with a LoRA stacked on the grounded rows",
    description=DESCRIPTION,
    settings=settings,
    run=run,
)


parser = COMMAND.parser
# (DataArguments, RowStart, SFTArguments, LoraModelConfig, RecommendationConfig) from arguments (and --config)
parse = COMMAND.parse
