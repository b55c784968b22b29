"""The recommendation stage's settings (a TRL ``SFTConfig``), apart from its trainer so that parsing them stays
light."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from ..training.config import RunConfig


@dataclass
class RecommendationConfig(RunConfig):
    """``RunConfig`` with the recommendation stage's defaults (LoRA + new rows, loss on the SID only)."""

    default_steps: ClassVar[int] = 400

    learning_rate: float = field(
        default=5e-4, metadata={"help": "Learning rate of the LoRA and the new rows.", "aliases": ["--lr"]}
    )
    sid_softmax_loss: bool | None = field(
        default=None,
        metadata={
            "help": "SID-only softmax: normalise the loss of every SID target over the SID tokens only (the "
            "head's SID rows, never the text vocabulary); other labelled tokens keep the full vocabulary. None "
            "(default): on wherever it applies (a grounded adapter, no logit soft-capping, label smoothing, MoE "
            "router loss, DeepSpeed or FSDP), else the full head; true: required; false: the full head. "
            "Recorded in the adapter (metadata sid_softmax), so decoding and evaluation normalise the same way.",
            "nargs": "?",  # --sid_softmax_loss alone: true, as for a bool flag
            "const": True,
        },
    )
