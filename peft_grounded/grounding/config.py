"""The grounding stage's settings (a TRL ``SFTConfig``), apart from its trainer so that parsing them stays light."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from ..training.config import RunConfig


@dataclass
class GroundingConfig(RunConfig):
    """``RunConfig`` with the grounding stage's defaults.

    The GTI paper grounds with learning rate 1e-3 (only embedding rows move, so a large rate is safe) and
    computes the loss on the completion only.
    """

    default_steps: ClassVar[int] = 200

    learning_rate: float = field(default=1e-3, metadata={"help": "Learning rate of the new rows."})
    weight_decay: float = field(default=0.0, metadata={"help": "No decay: it would pull the rows to zero."})
