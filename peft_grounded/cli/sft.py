"""``peft-grounded sft``: recommendation SFT (LoRA + the new rows) from the command line
(:func:`peft_grounded.recommend.train_recommender`).

The flags are the fields of :class:`~.common.ModelArguments`, :class:`~.common.SFTArguments` and
:class:`~peft_grounded.recommend.RecommendationConfig` (TRL's ``SFTConfig``), parsed by TRL's parser;
``--config sft.yaml`` gives any of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .common import ModelArguments, SFTArguments, add_settings_command, settings_parser

NAME = "sft"
HELP = "train the recommender: next-item SID prediction with a LoRA stacked on the grounded rows"
DESCRIPTION = (
    "Start the new rows from a grounded adapter (--grounded) or a fresh initialisation (--init), stack a LoRA, "
    "and train next-item SFT on the catalogue's leave-one-out training histories. Writes OUTPUT_DIR/adapter "
    "(rows + LoRA, one artefact). Every flag is a field of ModelArguments, SFTArguments or RecommendationConfig "
    "(TRL's SFTConfig); --config FILE.yaml sets any of them."
)


def add_cli(subparsers: Any) -> None:
    add_settings_command(subparsers, NAME, HELP)


def parser() -> Any:
    from ..recommend.trainer import RecommendationConfig

    return settings_parser(NAME, DESCRIPTION, (ModelArguments, SFTArguments, RecommendationConfig))


def parse(argv: Sequence[str]) -> tuple[Any, ...]:
    """``(ModelArguments, SFTArguments, RecommendationConfig)`` from command-line arguments (and ``--config``)."""
    return parser().parse_args_and_config(list(argv))


def main(argv: Sequence[str]) -> int:
    return run(*parse(argv))


def run(model: ModelArguments, sft: SFTArguments, config: Any) -> int:
    """Train the recommender as the settings say; the same call serves the command line, YAML and Python."""
    from ..recommend.trainer import train_recommender

    catalogue, index = model.load()
    train_recommender(
        catalogue,
        index,
        config,
        model_path=model.model_name_or_path,
        grounded=sft.grounded,
        init=model.init,
        centroid_variant=model.centroid_variant,
        lora=sft.lora(),
        fmt=sft.prompt_format(),
        max_examples=model.max_examples,
        dtype=model.dtype,
    )
    print(f"recommender adapter: {config.output_dir}/adapter")
    return 0
