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
        default=5e-4, metadata={"help": "Learning rate of the LoRA and the new rows."}
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
    distill_weight: float = field(
        default=0.0,
        metadata={
            "help": "Weight of distillation from a SASRec teacher fitted on the same training split: each SID "
            "target's loss puts this weight on the soft cross-entropy against the teacher's next-item "
            "distribution (summed onto the SID trie level by level) and the rest on its own cross-entropy, "
            "both under the SID-only softmax (sid_softmax_loss). Zero: off, no teacher is fitted."
        },
    )
    distill_top_k: int = field(
        default=16,
        metadata={
            "help": "Teacher probabilities kept per SID level and target (the most likely codes, renormalised)."
        },
    )
    distill_minutes: float = field(
        default=2.0,
        metadata={
            "help": "Training time of the SASRec teacher in minutes (validation picks its epoch); the teacher and "
            "its targets are kept in OUTPUT_DIR/teacher, so a resumed run reuses them."
        },
    )

    sid_softmax_temperature: float = field(
        default=1.0,
        metadata={
            "help": "Temperature of the SID-only softmax in the loss (LETTER's ranking-guided generation loss): "
            "below 1 sharpens it, so the codes ranked just above the target weigh more. Training only; decoding "
            "keeps the plain logits. Needs the SID-only softmax."
        },
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
                *distillation_problems(self),
                checks.number_in(
                    "sid_softmax_temperature",
                    self.sid_softmax_temperature,
                    0,
                    low_open=True,
                    flag="--sid_softmax_temperature",
                ),
                None
                if self.sid_softmax_temperature == 1.0 or self.sid_softmax_loss is not False
                else "sid_softmax_temperature applies to the SID-only softmax: leave sid_softmax_loss on "
                "(or the temperature at 1)",
            ],
        )


def distillation_problems(config: RecommendationConfig) -> list[str | None]:
    """The distillation settings' range checks, and what distillation needs of the others."""
    from .. import checks

    problems = [
        checks.number_in("distill_weight", config.distill_weight, 0, 1, flag="--distill_weight"),
        checks.int_at_least("distill_top_k", config.distill_top_k, 1, flag="--distill_top_k"),
        checks.number_in(
            "distill_minutes", config.distill_minutes, 0, low_open=True, flag="--distill_minutes"
        ),
    ]
    if problems[0] is None and config.distill_weight > 0:
        if config.sid_softmax_loss is False:
            problems.append(
                "distill_weight > 0 needs the SID-only softmax (the teacher's targets are distributions over "
                "the SID tokens), got sid_softmax_loss=False (--sid_softmax_loss)"
            )
        if config.packing:
            problems.append("distill_weight > 0 needs unpacked rows, got packing=True (--packing)")
        if config.loss_type != "nll":
            problems.append(f"distill_weight > 0 mixes into the NLL loss, got loss_type={config.loss_type!r}")
    return problems
