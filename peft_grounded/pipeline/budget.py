"""What a strategy comparison runs with: each stage's own settings object, and what only the runner decides.

A :class:`Budget` holds the grounding stage's :class:`~peft_grounded.training.stage_config.GroundingConfig`, the SFT stage's
:class:`~peft_grounded.training.sft.RecommendationConfig` (both TRL ``SFTConfig``\\ s: the objects the stages take,
so no setting is translated twice), the stacked LoRA as ``peft.LoraConfig`` keyword arguments (what
``GroundedTokenConfig.lora`` records), the final evaluation's
:class:`~peft_grounded.evaluation.EvalSettings`, and the few choices that belong to the runner alone.

:meth:`Budget.record` is what a run's manifest stores: a resume refuses a budget whose record differs.

The strategies a comparison runs (:data:`STRATEGIES`: how the new rows start, optionally grounded) are below.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import torch

from .. import checks
from ..adapter.lora import checked_lora
from ..evaluation.metrics import EvalSettings
from ..prompts import PromptFormat
from ..sids.extended_base import RowStart
from ..training.grounding import GroundingConfig
from ..training.sft.recommendation_trainer import RecommendationConfig

DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
PARTS = ("valid", "test")
# no LoRA dropout: it costs CPU step time for no gain at small budgets (BENCHMARKS.md, "The recipe")
DEFAULT_LORA = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0, "target_modules": "all-linear"}


@dataclass
class Budget:
    """The settings every strategy of a comparison shares (see the module doc).

    Each stage's ``output_dir`` is set per run by the runner. ``seed`` is the sft config's: the runner's
    initialisation and sampling use it; :meth:`with_seed` sets it on every part. The precision is explicit
    (float32 unless given; :meth:`with_precision` sets it on every part), not the machine's choice of a bare
    config: a comparison runs as its budget says.
    """

    # None: no grounding stage (a budget for strategies that do not ground)
    grounding: GroundingConfig | None = field(default_factory=lambda: GroundingConfig(bf16=False))
    sft: RecommendationConfig = field(default_factory=lambda: RecommendationConfig(bf16=False))
    lora: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_LORA))
    evaluation: EvalSettings = field(default_factory=EvalSettings)
    # dtype the frozen base is loaded in ("bfloat16" halves its memory traffic); adapter weights stay float32
    weights_dtype: str = "float32"
    # how every strategy's rows start beyond its own init: the centroid variant and init_scale (row_start)
    start: RowStart = field(default_factory=RowStart)
    # the runner's own settings (their help is what benchmarks/bench_demo_recipe.py's flags show)
    eval_parts: tuple[str, ...] | None = field(
        default=None, metadata={"help": "The parts decoded at the end: valid and/or test (None: both)."}
    )
    eval_every: int = field(
        default=0, metadata={"help": "Validation Recall@10 during SFT every N steps (0: off)."}
    )
    keep_best: bool = field(
        default=False,
        metadata={
            "help": "End SFT with the adapter of the best validation Recall@10 (early stopping; needs eval_every)."
        },
    )
    keep_best_users: int | None = field(
        default=None,
        metadata={
            "help": "The validation users of the Recall points keep_best picks by (None: all of them, so that "
            "the pick is not the noise of a small sample; the curves keep curve_users)."
        },
    )
    block_lr: float | None = field(
        default=None,
        metadata={
            "help": "Full fine-tuning of the base's decoder blocks at this learning rate instead of the stacked "
            "LoRA (None: the LoRA); a reference row: the blocks are not in the adapter, so the run neither "
            "resumes nor keeps the best (pipeline.block_tuning)."
        },
    )
    curve_every: int | None = field(
        default=None,
        metadata={"help": "Validation NLL during SFT every N steps, for the learning curve (None/0: off)."},
    )
    curve_users: int = field(
        default=100, metadata={"help": "The fixed seeded validation users of both curves."}
    )
    max_train_examples: int | None = field(
        default=None, metadata={"help": "A seeded sample of the SFT examples (None: all sliding windows)."}
    )
    max_grounding_examples: int | None = field(
        default=None, metadata={"help": "A seeded sample of the grounding pairs (None: all)."}
    )

    def __post_init__(self) -> None:
        name = DTYPE_ALIASES.get(self.weights_dtype, self.weights_dtype)
        if name not in ("float32", "bfloat16", "float16"):
            raise ValueError(
                f"weights_dtype={self.weights_dtype!r}: use 'float32', 'bfloat16' or 'float16' "
                f"(aliases: {', '.join(DTYPE_ALIASES)})."
            )
        self.weights_dtype = name
        unknown = set(self.eval_parts or ()) - set(PARTS)
        if unknown or (self.eval_parts is not None and not self.eval_parts):
            raise ValueError(
                f"eval_parts={self.eval_parts!r}: name 'valid' and/or 'test' (or None for both)."
            )
        self.lora = checked_lora(self.lora)
        least = checks.int_at_least
        checks.raise_problems(
            "Budget",
            [
                least("eval_every", self.eval_every, 0),
                None
                if not self.keep_best or self.eval_every
                else "keep_best needs validation points during SFT: set eval_every >= 1",
                checks.number_in("block_lr", self.block_lr, 0, low_open=True, none_ok=True),
                None
                if self.block_lr is None or not self.keep_best
                else "block_lr (full fine-tuning of the blocks) cannot keep the best: the blocks are not saved "
                "with the adapter; turn keep_best off",
                least("curve_every", self.curve_every, 0, none_ok=True),
                least("curve_users", self.curve_users, 1),
                least("keep_best_users", self.keep_best_users, 1, none_ok=True),
                least("max_train_examples", self.max_train_examples, 1, none_ok=True),
                least("max_grounding_examples", self.max_grounding_examples, 1, none_ok=True),
            ],
        )  # the stages' configs, the LoRA and the evaluation settings check their own fields

    @classmethod
    def from_training(
        cls,
        training: dict[str, Any] | None = None,
        *,
        grounding: dict[str, Any] | bool | None = None,
        sft: dict[str, Any] | None = None,
        lora: dict[str, Any] | None = None,
        evaluation: EvalSettings | None = None,
        **runner: Any,
    ) -> Budget:
        """A budget whose stages share the ``training`` fields (``SFTConfig`` names: batch size, max_length,
        bf16, save_steps, ...), ``grounding`` and ``sft`` adding each stage's own (max_steps, learning_rate,
        max_minutes, ...; ``grounding=False``: no grounding stage, for strategies that do not ground); ``lora``
        overrides fields of the default LoRA; ``runner``: the other fields."""
        training = {
            "bf16": False,
            **(training or {}),
        }  # a budget's precision is explicit (see with_precision)
        return cls(
            grounding=None if grounding is False else GroundingConfig(**training, **(grounding or {})),
            sft=RecommendationConfig(**training, **(sft or {})),
            lora=DEFAULT_LORA | (lora or {}),
            evaluation=evaluation or EvalSettings(),
            **runner,
        )

    def grounding_config(self) -> GroundingConfig:
        """The grounding stage's config; a clear error for a budget without one (``grounding=None``)."""
        if self.grounding is None:
            raise checks.SettingsError(
                "Budget: this strategy grounds, but the budget has no grounding stage (grounding=None, or "
                "from_training(grounding=False)): give it a GroundingConfig."
            )
        return self.grounding

    @property
    def seed(self) -> int:
        return self.sft.seed

    def with_seed(self, seed: int) -> Budget:
        """This budget with ``seed`` in every stage and in the evaluation."""
        return replace(
            self,
            grounding=self.grounding and replace(self.grounding, seed=seed),
            sft=replace(self.sft, seed=seed),
            evaluation=replace(self.evaluation, seed=seed),
        )

    def row_start(self, init: str) -> RowStart:
        """How a strategy whose rows start with ``init`` starts them under this budget (:attr:`start` with
        that ``init``)."""
        return replace(self.start, init=init)

    @property
    def bf16(self) -> bool:
        """Whether the stages train under bf16 autocast."""
        return bool(self.sft.bf16)

    def with_precision(self, bf16: bool) -> Budget:
        """This budget in bf16 (autocast in training and decoding, a bfloat16 base) or in float32."""
        return replace(
            self,
            grounding=self.grounding and replace(self.grounding, bf16=bf16),
            sft=replace(self.sft, bf16=bf16),
            evaluation=replace(self.evaluation, bf16=bf16),
            weights_dtype="bfloat16" if bf16 else "float32",
        )

    @property
    def parts(self) -> tuple[str, ...]:
        """The split parts evaluated at the end of a run."""
        return tuple(self.eval_parts) if self.eval_parts else PARTS

    @property
    def dtype(self) -> torch.dtype:
        """The frozen base's dtype (adapter weights always train in float32)."""
        return getattr(torch, self.weights_dtype)

    @property
    def show_progress(self) -> bool:
        return not self.sft.disable_tqdm

    def eval_settings(self, **overrides: Any) -> EvalSettings:
        """The evaluation settings (``overrides`` replace fields)."""
        return replace(self.evaluation, **overrides)

    def record(self) -> dict[str, Any]:
        """The budget as a run's manifest stores it (a resume compares it field by field): the seed; per stage
        its :data:`STAGE_FIELDS` and the other settings that differ from its config's defaults (``grounding``
        None: no grounding stage); the LoRA; the evaluation settings; the runner's own fields."""
        parts = {"grounding", "sft", "lora", "evaluation", "start"}
        return {
            "seed": self.seed,
            "grounding": None if self.grounding is None else _stage_record(self.grounding),
            "sft": _stage_record(self.sft),
            "lora": dict(self.lora),
            "evaluation": asdict(self.evaluation),
            "start": {"centroid_variant": self.start.centroid_variant, "init_scale": self.start.init_scale},
            **{f.name: getattr(self, f.name) for f in fields(self) if f.name not in parts},
        }


# the fields of a stage's config that its record always holds (its other fields: where they differ from the
# defaults)
STAGE_FIELDS = (
    "max_steps",
    "max_minutes",
    "learning_rate",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "max_length",
    "bf16",
    "seed",
)
# fields that do not change what a stage trains: where it writes (the runner sets it per run), the progress bar
NOT_RECORDED = {"output_dir", "logging_dir", "disable_tqdm"}


def _stage_record(config: Any) -> dict[str, Any]:
    """A stage's :data:`STAGE_FIELDS`, plus its other fields that differ from its class's defaults."""
    values, defaults = config.to_dict(), type(config)().to_dict()
    changed = {
        k: v
        for k, v in values.items()
        if k not in STAGE_FIELDS and k not in NOT_RECORDED and v != defaults.get(k)
    }
    return {k: values[k] for k in STAGE_FIELDS} | changed


@dataclass
class Experiment:
    """The data every strategy of a comparison shares."""

    model_path: str
    catalogue: Any
    index: Any
    split: Any = None
    fmt: PromptFormat = field(default_factory=PromptFormat)

    def __post_init__(self) -> None:
        if self.split is None:
            self.split = self.catalogue.leave_one_out()


# The strategies a comparison runs: how the new rows start (an initialisation), optionally grounded.


@dataclass(frozen=True)
class Strategy:
    """How the new rows start: an initialisation, optionally followed by grounding."""

    name: str
    init: str
    ground: bool = False
    description: str = ""
    # None: a grounded adapter; "peft": PEFT's own LoraConfig(trainable_token_indices=...), the baseline
    adapter: str | None = None


STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy(
            "mean", "mean", description="every new row = the vocabulary mean (the GTI paper's baseline)"
        ),
        Strategy(
            "gaussian",
            "gaussian",
            description="draws from N(mean, cov) of the vocabulary (the centroid paper's baseline)",
        ),
        Strategy("random", "random", description="the model's initialiser, N(0, initializer_range)"),
        Strategy("centroid", "centroid", description="SID-region centroids, projected and mean-shifted"),
        Strategy("gti", "mean", ground=True, description="mean init, then grounding (GTI)"),
        Strategy(
            "centroid_gti",
            "centroid",
            ground=True,
            description="centroid init, then grounding (neither paper ran it)",
        ),
        Strategy(
            "peft_default",
            "mean",
            adapter="peft",
            description="without this package: mean_resizing + PEFT's LoraConfig(trainable_token_indices)",
        ),
    )
}


def strategy(name: str) -> Strategy:
    if name not in STRATEGIES:
        raise ValueError(f"Unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}.")
    return STRATEGIES[name]
