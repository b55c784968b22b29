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
    augment_views: int = field(
        default=0,
        metadata={
            "help": "Altered copies of each training history (chunk or window) added to the data, each "
            "with items dropped at random (--augment_drop), as CL4SRec's crops and masks: more distinct "
            "examples per epoch against overfitting. 0: none."
        },
    )
    augment_drop: float = field(
        default=0.2,
        metadata={"help": "Share of a history's items dropped in an altered copy (at least two items stay)."},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        from .. import checks

        checks.raise_problems(
            "RecommendationConfig",
            [
                checks.int_at_least("augment_views", self.augment_views, 0, flag="--augment_views"),
                checks.number_in(
                    "augment_drop", self.augment_drop, 0, 1, high_open=True, flag="--augment_drop"
                ),
            ],
        )
