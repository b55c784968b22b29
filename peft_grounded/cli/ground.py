"""``peft-grounded ground``: the grounding stage from the command line (:func:`peft_grounded.grounding.ground`).

The flags are the fields of :class:`~.common.ModelArguments` and :class:`~peft_grounded.grounding.GroundingConfig`
(TRL's ``SFTConfig``), parsed by TRL's parser; ``--config ground.yaml`` gives any of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .common import ModelArguments, add_settings_command, settings_parser

NAME = "ground"
HELP = "ground the new SID tokens (train only their rows on text <-> SID pairs, backbone frozen)"
DESCRIPTION = (
    "Add the SID index's tokens to the model, initialise their rows, and train only those rows on the six GTI "
    "text <-> SID templates through TRL's SFTTrainer. Writes OUTPUT_DIR/adapter. Every flag is a field of "
    "ModelArguments or of GroundingConfig (TRL's SFTConfig); --config FILE.yaml sets any of them."
)


def add_cli(subparsers: Any) -> None:
    add_settings_command(subparsers, NAME, HELP)


def parser() -> Any:
    from ..grounding.trainer import GroundingConfig

    return settings_parser(NAME, DESCRIPTION, (ModelArguments, GroundingConfig))


def parse(argv: Sequence[str]) -> tuple[Any, ...]:
    """``(ModelArguments, GroundingConfig)`` from command-line arguments (and ``--config FILE.yaml``)."""
    return parser().parse_args_and_config(list(argv))


def main(argv: Sequence[str]) -> int:
    return run(*parse(argv))


def run(model: ModelArguments, config: Any) -> int:
    """Ground as the settings say; the same call serves the command line, a YAML file and Python."""
    from ..grounding.trainer import ground

    catalogue, index = model.load()
    ground(
        catalogue,
        index,
        config,
        model_path=model.model_name_or_path,
        init=model.init,
        centroid_variant=model.centroid_variant,
        max_examples=model.max_examples,
        dtype=model.dtype,
    )
    print(f"grounded adapter: {config.output_dir}/adapter")
    return 0
