"""The settings of each training stage: ``RunConfig``, TRL's ``SFTConfig`` with the defaults every stage of this
package shares, checked when it is made (before anything loads); the grounding stage's ``GroundingConfig`` and
the recommendation SFT's ``RecommendationConfig`` on top of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from trl import SFTConfig


@dataclass
class RunConfig(SFTConfig):
    """``SFTConfig`` with the defaults every stage of this package shares; the settings of a training stage.

    Every field is a command-line flag under its own name (``peft-grounded ground --learning_rate 1e-3``, also
    ``--learning-rate``) and a key of a ``--config stage.yaml``. Differences from TRL's defaults: ``bf16``
    chosen by the CPU (off where bf16 is emulated), the CPU unless CUDA is available (``use_cpu``), the
    stage's own ``max_steps`` (:attr:`default_steps`), a cosine schedule with 3% warm-up, no activation
    checkpointing (TRL's ``gradient_checkpointing=True`` left unset: transformers warns at any value of that
    deprecated alias), no logging integrations.
    """

    default_steps: ClassVar[int] = -1  # max_steps when none is given (-1: TRL's epochs)
    min_steps: ClassVar[int] = 1  # the fewest max_steps taken (incremental grounding takes 0: no step)

    output_dir: str | None = field(
        default=None,
        metadata={"help": "Output directory: checkpoints, adapter/, run.json, log_history.json."},
    )
    max_steps: int | None = field(
        default=None,
        metadata={
            "help": "Optimisation steps. None: the stage's default, or with max_minutes no step limit; -1: epochs."
        },
    )
    learning_rate: float = field(default=2e-5, metadata={"help": "Learning rate."})
    per_device_train_batch_size: int = field(default=16, metadata={"help": "Batch size per device."})
    gradient_accumulation_steps: int = field(
        default=1, metadata={"help": "Batches accumulated per optimisation step."}
    )
    lr_scheduler_type: str = field(default="cosine", metadata={"help": "Learning-rate schedule."})
    warmup_ratio: float = field(default=0.03, metadata={"help": "Share of the steps spent warming up."})
    max_length: int | None = field(
        default=256, metadata={"help": "Longest training row in tokens; longer rows are refused."}
    )
    bf16: bool | None = field(
        default=None,
        metadata={
            "help": "bf16 mixed precision; None: the machine's choice on a CPU (on where it has native bf16, off "
            "where bf16 is emulated, see peft_grounded.precision), TRL's (on) on a GPU.",
            "nargs": "?",
            "const": True,
        },
    )
    use_cpu: bool | None = field(
        default=None, metadata={"help": "Train on the CPU. None: the CPU unless CUDA is available."}
    )
    seed: int = field(default=0, metadata={"help": "Seed of the run (initialisation, data order, sampling)."})
    save_steps: float = field(default=100, metadata={"help": "Steps between checkpoints."})
    resume_from_checkpoint: str | None = field(
        default=None,
        metadata={
            "help": "Continue a run: 'last' (what the flag alone gives) from the last checkpoint in output_dir, "
            "or start it when there is none yet; or the path of a checkpoint.",
            "nargs": "?",
            "const": "last",
        },
    )
    completion_only_loss: bool | None = field(default=True, metadata={"help": "Loss on the completion only."})
    activation_checkpointing: bool | None = field(
        default=None,
        metadata={
            "help": "Recompute activations in the backward pass (saves memory, costs time). None: off.",
            "nargs": "?",
            "const": True,
        },
    )
    # transformers' deprecated alias, unset by default (TRL sets it, and any value set makes transformers warn)
    gradient_checkpointing: bool | None = field(
        default=None,
        metadata={
            "help": "Deprecated alias of --activation_checkpointing (transformers' old name).",
            "nargs": "?",
            "const": True,
        },
    )
    save_total_limit: int | None = field(default=2, metadata={"help": "Checkpoints kept on disk."})
    report_to: str | None = field(
        default="none", metadata={"help": "Logging integrations, e.g. tensorboard, wandb (none by default)."}
    )
    compact_loss: bool = field(
        default=True,
        metadata={
            "help": "Project only the labelled (completion) positions through the LM head, on every device; "
            "TRL does so on CUDA only (see peft_grounded.sid_head.compact_head)."
        },
    )
    max_minutes: float | None = field(
        default=None,
        metadata={
            "help": "Stop after this many minutes of training (evaluation excluded), or at max_steps if that "
            "comes first; the learning rate then warms up over warmup_ratio of the time and decays linearly "
            "to 0 at the time limit (lr_scheduler_type is not used).",
        },
    )
    allow_truncation: bool = field(
        default=False,
        metadata={"help": "Train on rows that max_length cuts (with a warning) instead of refusing them."},
    )
    padding_free: bool | None = field(
        default=None,
        metadata={
            "help": "Concatenate a batch's rows into one, positions restarting at each row, instead of padding "
            "them (TRL's padding_free; same loss). None: on where padded batches would hold at least "
            "padding_free_ratio() times their real tokens (pre-tokenised rows only).",
            "nargs": "?",
            "const": True,
        },
    )

    compile_blocks: bool | None = field(
        default=None,
        metadata={
            "help": "torch.compile each decoder block's MLP and norms (attention stays eager) while training. "
            "None: wants_compile_blocks() decides (bf16 on a CPU, a long run, a C++ compiler found).",
            "nargs": "?",
            "const": True,
        },
    )
    float32_stream: bool = field(
        default=False,
        metadata={
            "help": "Under bf16, carry the residual stream (from the input embeddings on) and the SID logits in "
            "float32; the linear layers still run in bf16.",
            "nargs": "?",
            "const": True,
        },
    )
    fused_lora: bool | None = field(
        default=None,
        metadata={
            "help": "Run each plain LoRA layer as one product of its stacked frozen weight and LoRA A while "
            "training (training.fused_lora; same loss). None: on a CPU, in a single process.",
            "nargs": "?",
            "const": True,
        },
    )

    def __post_init__(self) -> None:
        if self.max_steps is None:
            self.max_steps = -1 if self.max_minutes is not None else self.default_steps
        if self.use_cpu is None:
            self.use_cpu = not torch.cuda.is_available()
        check_run_config(self)
        if not self.fp16 and (self.use_cpu or not torch.cuda.is_available()):
            from ..precision import resolve_bf16

            # TRL turns bf16 on when it is not set; on a CPU that emulates bf16 that is many times slower
            self.bf16 = resolve_bf16(self.bf16, "cpu", "bf16 mixed precision (bf16=True, --bf16)")
        super().__post_init__()

    @property
    def resume(self) -> str | bool | None:
        """``resume_from_checkpoint`` as :meth:`RunTrainer.train` takes it (``True``: the last checkpoint)."""
        value = self.resume_from_checkpoint
        if value is None or str(value).lower() in ("", "false", "no", "none"):
            return None
        return True if str(value).lower() in ("last", "true", "yes") else value


def check_run_config(args: Any) -> None:
    """Refuse a training budget out of range before anything loads (transformers would quietly train
    ``num_train_epochs`` epochs for ``max_steps <= 0``, and fail deep in the loop on a zero batch size)."""
    from .. import checks

    minutes = getattr(args, "max_minutes", None)
    steps = args.max_steps
    if minutes is None:
        steps_problem = None
        if not checks.is_int(steps) or (steps < getattr(args, "min_steps", 1) and steps != -1):
            steps_problem = (
                f"max_steps must be a positive number of optimisation steps, got {steps!r} (--max_steps), "
                "which transformers does not take as a step count (it falls back to training epochs); give "
                "--max_steps N >= 1, or --max_minutes M for a time budget (-1: num_train_epochs epochs, on "
                "purpose)"
            )
    else:
        steps_problem = checks.int_at_least(
            "max_steps", steps, -1, flag="--max_steps; 0 or -1 with --max_minutes: time alone"
        )
    checks.raise_problems(
        type(args).__name__,
        [
            steps_problem,
            checks.number_in("max_minutes", minutes, 0, low_open=True, flag="--max_minutes", none_ok=True),
            checks.int_at_least(
                "per_device_train_batch_size",
                args.per_device_train_batch_size,
                1,
                flag="--per_device_train_batch_size",
            ),
            checks.int_at_least(
                "gradient_accumulation_steps",
                args.gradient_accumulation_steps,
                1,
                flag="--gradient_accumulation_steps",
            ),
            checks.number_in("learning_rate", args.learning_rate, 0, low_open=True, flag="--learning_rate"),
            checks.int_at_least("max_length", args.max_length, 1, flag="--max-length", none_ok=True),
            checks.number_in("save_steps", args.save_steps, 0, low_open=True, flag="--save-steps"),
            checks.number_in("logging_steps", args.logging_steps, 0, low_open=True),
            checks.number_in("warmup_ratio", args.warmup_ratio, 0, 1, none_ok=True),
            checks.number_in("num_train_epochs", args.num_train_epochs, 0, low_open=True),
            checks.number_in("weight_decay", args.weight_decay, 0),
            checks.seed("seed", args.seed, flag="--seed"),
            checks.number_in(  # NEFTune's noise: transformers fails at the first step on a negative one
                "neftune_noise_alpha",
                getattr(args, "neftune_noise_alpha", None),
                0,
                low_open=True,
                flag="--neftune_noise_alpha; leave it out for no noise",
                none_ok=True,
            ),
        ],
    )


def check_max_examples(n: int | None) -> None:
    """Refuse a sample size that would leave no training rows (``None``: every row)."""
    from .. import checks

    checks.raise_problems(
        "training data", [checks.int_at_least("max_examples", n, 1, flag="--max-examples", none_ok=True)]
    )


PADDING_FREE_RATIO = {"cpu": 1.05, "other": 1.5}
"""``padding_free=None`` turns padding-free batches on where padded batches would hold at least this many times
their real tokens (BENCHMARKS.md, "The step against its matrix products"). On a CPU the trainer attends within
each packed sequence (``training.steps.training_attention``), so a padding-free batch saves what padding there
is; elsewhere SDPA attends over the whole concatenated row under a block-diagonal mask, which costs more than
the padding saved where rows are of similar length."""


def padding_free_ratio(device_type: str) -> float:
    """:data:`PADDING_FREE_RATIO` for a device type (``"cpu"``, ``"cuda"``, ...)."""
    return PADDING_FREE_RATIO["cpu" if device_type == "cpu" else "other"]


def wants_padding_free(
    dataset, batch_size: int, seed: int = 0, batches: int = 200, device_type: str = "cpu"
) -> bool:
    """Whether ``batch_size`` random rows of ``dataset`` padded to their longest would hold at least
    :func:`padding_free_ratio` times their tokens on ``device_type`` (seeded; ``False`` for rows not yet
    tokenised)."""
    import random

    if dataset is None or not hasattr(dataset, "column_names") or "input_ids" not in dataset.column_names:
        return False
    lengths = [len(ids) for ids in dataset["input_ids"]]
    if len(lengths) < 2 or batch_size < 2:
        return False
    rng = random.Random(seed)
    padded = real = 0
    for _ in range(batches):
        rows = rng.sample(lengths, min(batch_size, len(lengths)))
        padded += max(rows) * len(rows)
        real += sum(rows)
    return padded >= padding_free_ratio(device_type) * real


# The grounding stage's settings (a TRL ``SFTConfig``), apart from its trainer so that parsing them stays light.


@dataclass
class GroundingConfig(RunConfig):
    """``RunConfig`` with the grounding stage's defaults.

    The GTI paper grounds with learning rate 1e-3 (only embedding rows move, so a large rate is safe) and
    computes the loss on the completion only.
    """

    default_steps: ClassVar[int] = 200

    learning_rate: float = field(default=1e-3, metadata={"help": "Learning rate of the new rows."})
    weight_decay: float = field(default=0.0, metadata={"help": "No decay: it would pull the rows to zero."})


# The recommendation stage's settings (a TRL ``SFTConfig``), apart from its trainer so that parsing them stays
# light.


@dataclass
class RecommendationConfig(RunConfig):
    """``RunConfig`` with the recommendation stage's defaults (LoRA + new rows, loss on the SID only)."""

    default_steps: ClassVar[int] = 400

    learning_rate: float = field(
        default=5e-4, metadata={"help": "Learning rate of the LoRA and the new rows."}
    )
    sid_softmax: bool | None = field(
        default=None,
        metadata={
            "help": "SID-only softmax: normalise the loss of every SID target over the SID tokens only (the "
            "head's SID rows, never the text vocabulary); other labelled tokens keep the full vocabulary. None "
            "(default): on wherever it applies (a grounded adapter, no logit soft-capping, label smoothing, MoE "
            "router loss, DeepSpeed or FSDP), else the full head; true: required; false: the full head. "
            "Recorded in the adapter (metadata sid_softmax), so decoding and evaluation normalise the same way.",
            "nargs": "?",  # --sid_softmax alone: true, as for a bool flag
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
            "both under the SID-only softmax (sid_softmax). Zero: off, no teacher is fitted."
        },
    )
    distill_top_k: int = field(
        default=16,
        metadata={
            "help": "Teacher probabilities kept per SID level and target (the most likely codes, renormalised)."
        },
    )
    distill_confident_share: float = field(
        default=1.0,
        metadata={
            "help": "Share of the SID targets distilled: those where the teacher's most likely next item is "
            "most likely (its confidence); the rest train on their own cross-entropy alone, so the student "
            "learns its own answer where the teacher is unsure. 1: every target, which the fused validation "
            "Recall (fuse-peer) preferred to 0.5 on ML-100K and Office (BENCHMARKS.md)."
        },
    )
    distill_epochs: int = field(
        default=200,
        metadata={
            "help": "The SASRec teacher's most epochs; it stops when validation has not improved for 10 epochs "
            "and keeps its best epoch, so the same data and seed give the same teacher. The teacher and its "
            "targets are kept in OUTPUT_DIR/teacher, so a resumed run reuses them."
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
                if self.sid_softmax_temperature == 1.0 or self.sid_softmax is not False
                else "sid_softmax_temperature applies to the SID-only softmax: leave sid_softmax on "
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
            "distill_confident_share",
            config.distill_confident_share,
            0,
            1,
            low_open=True,
            flag="--distill_confident_share",
        ),
        checks.int_at_least("distill_epochs", config.distill_epochs, 1, flag="--distill_epochs"),
    ]
    if problems[0] is None and config.distill_weight > 0:
        if config.sid_softmax is False:
            problems.append(
                "distill_weight > 0 needs the SID-only softmax (the teacher's targets are distributions over "
                "the SID tokens), got sid_softmax=False (--sid_softmax)"
            )
        if config.packing:
            problems.append("distill_weight > 0 needs unpacked rows, got packing=True (--packing)")
        if config.loss_type != "nll":
            problems.append(f"distill_weight > 0 mixes into the NLL loss, got loss_type={config.loss_type!r}")
    return problems
