"""``peft-grounded ground``: the grounding stage from the command line (:func:`peft_grounded.training.grounding.ground`).

The flags are the fields of :class:`~.common.DataArguments`, :class:`~peft_grounded.sids.extended_base.RowStart` (how
the new rows start), :class:`~.model_config.GroundedModelConfig` (TRL's ``ModelConfig``) and
:class:`~peft_grounded.training.stage_config.GroundingConfig` (TRL's ``SFTConfig``), parsed by TRL's parser;
``--config ground.yaml`` gives any of them. The parsed ``RowStart`` is passed down as it is, to the model it
starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .common import Command, DataArguments

if TYPE_CHECKING:
    from ..sids.extended_base import RowStart
    from .model_config import GroundedModelConfig

DESCRIPTION = (
    "Add the SID index's tokens to the model, initialise their rows, and train only those rows on the six GTI "
    "text <-> SID templates through TRL's SFTTrainer. Writes OUTPUT_DIR/adapter. Every flag is a field of "
    "DataArguments, RowStart (how the new rows start), ModelConfig (TRL's) or GroundingConfig (TRL's "
    "SFTConfig)."
)


def settings() -> tuple[type, ...]:
    from ..sids.extended_base import RowStart
    from ..training.stage_config import GroundingConfig
    from .model_config import GroundedModelConfig

    return (DataArguments, RowStart, GroundedModelConfig, GroundingConfig)


def check(data: DataArguments, start: RowStart, base: GroundedModelConfig, config: Any) -> None:
    """What no single dataclass can refuse: ground trains no LoRA."""
    if base.use_peft:
        raise ValueError("ground trains only the new rows: leave out --use_peft (sft stacks the LoRA)")


def run(data: DataArguments, start: RowStart, base: GroundedModelConfig, config: Any) -> int:
    """Ground as the settings say; the same call serves the command line, a YAML file and Python."""
    from ..training.grounding import ground

    catalogue, index = data.load()
    ground(
        catalogue,
        index,
        config,
        model_path=base.model_path(config.output_dir),
        start=start,
        max_examples=data.max_examples,
        dtype=base.torch_dtype(),
    )
    print(f"grounded adapter: {config.output_dir}/adapter")
    return 0


COMMAND = Command(
    name="ground",
    help="ground the new SID tokens (train only their rows on text <-> SID pairs, backbone frozen)",
    description=DESCRIPTION,
    settings=settings,
    run=run,
    check=check,
)


parser = COMMAND.parser
# (DataArguments, RowStart, GroundedModelConfig, GroundingConfig) from arguments (and --config)
parse = COMMAND.parse
