"""``peft-grounded sft``: recommendation SFT (LoRA + the new rows) from the command line
(:func:`peft_grounded.training.sft.train_recommender`).

The flags are the fields of :class:`~.common.ModelArguments`, :class:`~.common.SFTArguments`,
:class:`~.model_config.LoraModelConfig` (TRL's ``ModelConfig``: the base model and the LoRA) and
:class:`~peft_grounded.training.sft.RecommendationConfig` (TRL's ``SFTConfig``), parsed by TRL's parser;
``--config sft.yaml`` gives any of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .common import Command, ModelArguments, SFTArguments

if TYPE_CHECKING:
    from .model_config import LoraModelConfig

DESCRIPTION = (
    "Start the new rows from a grounded adapter (--grounded) or a fresh initialisation (--init), stack a LoRA, "
    "and train next-item SFT on the catalogue's leave-one-out training histories. Writes OUTPUT_DIR/adapter "
    "(rows + LoRA, one artefact). --recipe cpu: the recipe chosen on validation per CPU minute (the demo's). "
    "Every flag is a field of ModelArguments, SFTArguments, ModelConfig (TRL's: the base model and the LoRA) "
    "or RecommendationConfig (TRL's SFTConfig)."
)


def settings() -> tuple[type, ...]:
    from ..training.config import RecommendationConfig
    from .model_config import LoraModelConfig

    return (ModelArguments, SFTArguments, LoraModelConfig, RecommendationConfig)


def recipes() -> Any:
    from .common import RECIPES

    return RECIPES


def run(model: ModelArguments, sft: SFTArguments, base: LoraModelConfig, config: Any) -> int:
    """Train the recommender as the settings say; the same call serves the command line, YAML and Python."""
    from ..training.sft.trainer import train_recommender

    catalogue, index = model.load()
    train_recommender(
        catalogue,
        index,
        config,
        grounded=sft.grounded,
        lora=base.lora(),
        fmt=sft.prompt_format(),
        **model.start(base, config.output_dir),
    )
    print(f"recommender adapter: {config.output_dir}/adapter")
    return 0


COMMAND = Command(
    name="sft",
    help="train the recommender: next-item SID prediction with a LoRA stacked on the grounded rows",
    description=DESCRIPTION,
    settings=settings,
    run=run,
    recipes=recipes,
)


parser = COMMAND.parser
# (ModelArguments, SFTArguments, LoraModelConfig, RecommendationConfig) from arguments (and --config)
parse = COMMAND.parse
