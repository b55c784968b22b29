"""The demo's default preset with one recipe changed: depth, softmax, start, budgets, learning rates, users.

    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
      python benchmarks/bench_demo_recipe.py --out runs/demo-full-head --sft-set sid_softmax=false

Runs ``peft_grounded.pipeline.demo.run_demo`` (SIDs, the strategies, peers, report) with the ``default``
preset's settings except those given here, and prints the wall time; the report is ``<out>/report.md``.
The package's settings dataclasses are parsed as they are: ``ItemVectorsConfig`` (what the SIDs and the
centroid start are built from) and ``RowStart`` (``--init_scale``, ``--centroid_variant``), the preset's
values their defaults; any field of SFT's ``RecommendationConfig`` is ``--sft-set FIELD=VALUE``.
``--dataset`` runs the same recipe on another catalogue (Amazon Office: ``--dataset
../shared/data/amazon-office``). Budgets are steps (``--sft-steps``; a busy machine cannot change them)
or, with ``--sft-minutes`` / ``--grounding-minutes``, minutes. Every flag left out keeps the preset's value.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from typing import Literal

from peft_grounded.sids.behaviour import ItemVectorsConfig
from peft_grounded.sids.extended_base import RowStart

try:
    from benchmarks._args import REPEATABLE, OnOff, ZeroOrMore, parse
except ModuleNotFoundError:  # run as a file: its folder is on sys.path, not the repository
    from _args import REPEATABLE, OnOff, ZeroOrMore, parse


@dataclass
class Settings:
    """The preset's settings this run changes: None (a flag left out) keeps the preset's value. What the SIDs
    and the centroid start are built from, and how the rows start: ItemVectorsConfig's and RowStart's fields,
    the preset's by default; SFT's other settings: --sft-set."""

    out: str = field(metadata={"help": "the demo's output folder (resumed when it exists)"})
    dataset: str = field(
        default="movielens-100k",
        metadata={
            "help": "the catalogue (load_catalogue: a name or a folder such as ../shared/data/amazon-office)"
        },
    )
    layers: int | None = field(default=None, metadata={"help": "keep the base's first N blocks (0: all 30)"})
    lora_r: int | None = field(default=None, metadata={"help": "the stacked LoRA's rank (alpha: twice it)"})
    lora_dropout: float | None = field(default=None, metadata={"help": "the stacked LoRA's dropout"})
    block_lr: float | None = field(
        default=None,
        metadata={
            "help": "full fine-tuning of the kept blocks at this learning rate instead of the stacked LoRA (a "
            "reference row: decoded in place, so no --keep-best and no resume)"
        },
    )
    codes: int | None = field(default=None, metadata={"help": "codes per SID level"})
    balanced: Literal["none", "last", "all"] | None = field(
        default=None, metadata={"help": "balanced RQ-KMeans levels of the SIDs"}
    )
    history: int | None = field(default=None, metadata={"help": "items of history per training window"})
    curve_every: int | None = field(default=None, metadata={"help": "validation NLL every N steps"})
    eval_every: int | None = field(
        default=None, metadata={"help": "validation Recall@10 every N SFT steps (0: off)"}
    )
    curve_users: int | None = field(default=None, metadata={"help": "validation users of both curves"})
    keep_best: bool = field(
        default=False,
        metadata={
            "help": "end SFT with the adapter of the best validation Recall@10 (early stopping; needs --eval-every)"
        },
    )
    sft_steps: int | None = field(default=None, metadata={"help": "SFT steps"})
    sft_minutes: float | None = field(default=None, metadata={"help": "a time budget instead of steps"})
    grounding_steps: int | None = field(default=None, metadata={"help": "grounding steps"})
    grounding_minutes: float | None = field(default=None, metadata={"help": "a time budget instead of steps"})
    grounding_lr: float | None = field(default=None, metadata={"help": "grounding's learning rate"})
    sft_lr: float | None = field(default=None, metadata={"help": "SFT's learning rate"})
    users: int | None = field(default=None, metadata={"help": "test users evaluated (0: all)"})
    exclude_history: bool | None = field(
        default=None,
        metadata={
            "help": "the LLM's lists without the user's history items, as the peers' (--no-exclude-history: kept; "
            "None: the preset's)",
            "action": OnOff,
        },
    )
    eval_parts: list[str] | None = field(
        default=None, metadata={"help": "parts decoded", "choices": ("valid", "test")}
    )
    peers: list[str] | None = field(
        default=None, metadata={"help": "the peers scored (none: --peers alone)", "action": ZeroOrMore}
    )
    sasrec_minutes: float | None = field(default=None, metadata={"help": "SASRec's time budget"})
    strategies: list[str] | None = field(default=None, metadata={"help": "the strategies run"})
    sft_set: list[str] = field(
        default_factory=list,
        metadata={
            "help": "FIELD=VALUE: any RecommendationConfig field of SFT (VALUE read as JSON, else as text), e.g. "
            "sid_softmax=false (the full head), weight_decay=0.05, padding_free=false, augment_views=2; "
            "repeatable"
        }
        | REPEATABLE,
    )
    max_train_examples: int | None = field(
        default=None, metadata={"help": "SFT on a seeded sample of this many training rows"}
    )
    seed: int | None = field(default=None, metadata={"help": "the run's seed"})
    precision: Literal["auto", "bf16", "fp32"] = field(
        default="auto", metadata={"help": "auto: bf16 where it runs natively, else float32"}
    )
    no_diagnostics: bool = field(default=False, metadata={"help": "skip the geometry report"})


def parse_args(argv=None) -> tuple[Settings, ItemVectorsConfig, RowStart]:
    """The settings, the item vectors' config and the rows' start (the preset's unless changed)."""
    from peft_grounded.pipeline.demo import PRESETS

    default = PRESETS["default"]
    return parse(
        (Settings, ItemVectorsConfig, RowStart),
        argv,
        prog="bench_demo_recipe.py",
        description=__doc__,
        check=preset,
        defaults=asdict(default.item_vectors) | asdict(default.budget.start),
    )


def _stage(config, steps: int | None, minutes: float | None, lr: float | None, **more):
    """``config`` with the budget and learning rate given (None: kept)."""
    changes = dict(more)
    if minutes is not None:
        changes |= dict(max_steps=0, max_minutes=minutes)  # the time alone ends the stage
    elif steps is not None:
        changes |= dict(max_steps=steps, max_minutes=None)
    if lr is not None:
        changes["learning_rate"] = lr
    return replace(config, **changes)


def _field_value(pair: str) -> tuple[str, object]:
    """``FIELD=VALUE`` of ``--sft-set``: the value as JSON (numbers, true, null), else as text."""
    import json

    name, sep, value = pair.partition("=")
    if not sep or not name:
        raise SystemExit(f"--sft-set takes FIELD=VALUE, got {pair!r}")
    try:
        return name, json.loads(value)
    except json.JSONDecodeError:
        return name, value


def preset(args: Settings, vectors: ItemVectorsConfig | None = None, start: RowStart | None = None):
    """The ``default`` preset with the arguments' changes (built and checked before any work); ``vectors``:
    the SIDs' item vectors, ``start``: how the rows start (None: the preset's; its ``init`` is each
    strategy's)."""
    from peft_grounded.pipeline.demo import PRESETS

    base = PRESETS["default"]
    old = base.budget
    if start is not None and start.init != old.start.init:
        raise SystemExit(
            f"--init {start.init}: each strategy starts its rows its own way; choose --strategies"
        )
    sft_changes = dict(_field_value(pair) for pair in args.sft_set)
    lora = old.lora if args.lora_r is None else old.lora | {"r": args.lora_r, "lora_alpha": 2 * args.lora_r}
    if args.lora_dropout is not None:
        lora = lora | {"lora_dropout": args.lora_dropout}
    evaluation = old.evaluation if args.users is None else replace(old.evaluation, users=args.users or None)
    if args.exclude_history is not None:
        evaluation = replace(evaluation, exclude_history=args.exclude_history)
    budget = replace(
        old,
        grounding=_stage(old.grounding, args.grounding_steps, args.grounding_minutes, args.grounding_lr),
        sft=_stage(old.sft, args.sft_steps, args.sft_minutes, args.sft_lr, **sft_changes),
        evaluation=evaluation,
        curve_every=old.curve_every if args.curve_every is None else args.curve_every,
        eval_every=old.eval_every if args.eval_every is None else args.eval_every,
        keep_best=args.keep_best,
        block_lr=args.block_lr,
        curve_users=old.curve_users if args.curve_users is None else args.curve_users,
        max_train_examples=old.max_train_examples
        if args.max_train_examples is None
        else args.max_train_examples,
        start=old.start if start is None else start,
        lora=lora,
        eval_parts=old.eval_parts if args.eval_parts is None else tuple(args.eval_parts),
    )
    spec = replace(base, budget=budget)
    if args.seed is not None:
        spec = replace(spec, seeds=(args.seed,))
    if args.layers is not None:
        spec = replace(spec, layers=args.layers)
    if args.codes is not None:
        spec = replace(spec, codes=args.codes)
    if args.balanced is not None:
        spec = replace(spec, balanced=args.balanced)
    if vectors is not None:
        spec = replace(spec, item_vectors=vectors)
    if args.history is not None:
        spec = replace(spec, fmt=replace(spec.prompt_format(), max_history=args.history))
    if args.peers is not None:
        spec = replace(spec, peers=tuple(args.peers))
    if args.sasrec_minutes is not None:
        spec = replace(spec, sasrec={"max_minutes": args.sasrec_minutes})
    if args.strategies:
        spec = replace(spec, strategies=tuple(args.strategies))
    return spec


def main(argv=None) -> None:
    from peft_grounded.pipeline.demo import run_demo

    args, vectors, start = parse_args(argv)
    started = time.perf_counter()
    run_demo(
        preset(args, vectors, start),
        args.out,
        catalogue=args.dataset,
        precision=args.precision,
        diagnostics=not args.no_diagnostics,
    )
    print(f"demo wall time: {time.perf_counter() - started:.1f} s ({vars(args)}, {vectors}, {start})")


if __name__ == "__main__":
    main()
