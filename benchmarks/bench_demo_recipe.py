"""The demo's default preset with one recipe changed: depth, softmax, start, budgets, learning rates, users.

    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
      python benchmarks/bench_demo_recipe.py --out runs/demo-full-head --sft-set sid_softmax=false

Runs ``peft_grounded.pipeline.demo.run_demo`` (SIDs, the strategies, peers, report) with the ``default``
preset's settings except those given here, and prints the wall time; the report is ``<out>/report.md``.
Every setting the package declares is parsed from its declaration under its flag, the preset's value its
default: ``ItemVectorsConfig`` (what the SIDs and the centroid start are built from) and ``RowStart``
(``--init_scale``, ``--centroid_variant``) as they are; of ``LoraModelConfig`` ``--layers``, ``--lora_r``,
``--lora_alpha`` (None: the preset's alpha / r kept) and ``--lora_dropout``; of ``BuildSIDsArguments``
``--codes`` and ``--balanced``; of ``SFTArguments`` ``--max_history``; of the ``Budget`` its runner's
``--eval_parts``, ``--eval_every``, ``--keep_best``, ``--block_lr``, ``--curve_every``, ``--curve_users`` and
``--max_train_examples``; of the ``Preset`` ``--peers`` (alone: none); of ``DemoArguments`` ``--strategies``
(none: the preset's), ``--precision`` and ``--no_diagnostics``; of ``RecommendationConfig`` ``--seed`` (the
run's one seed). Any other field of SFT's ``RecommendationConfig`` is ``--sft-set FIELD=VALUE`` (its learning
rate: ``--sft-set learning_rate=1e-3``), of grounding's ``GroundingConfig`` ``--grounding-set FIELD=VALUE``.
``--dataset`` runs the same recipe on another catalogue (Amazon Office: ``--dataset
../shared/data/amazon-office``). Budgets are steps (``--sft-steps``; a busy machine cannot change them)
or, with ``--sft-minutes`` / ``--grounding-minutes``, minutes. Every flag left out keeps the preset's value.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace

from peft_grounded.cli.common import SFTArguments
from peft_grounded.cli.demo import DemoArguments
from peft_grounded.cli.model_config import LoraModelConfig
from peft_grounded.cli.sids import BuildSIDsArguments
from peft_grounded.pipeline.budget import Budget
from peft_grounded.pipeline.demo import PRESETS, Preset
from peft_grounded.sids.behaviour import ItemVectorsConfig
from peft_grounded.sids.extended_base import RowStart
from peft_grounded.training.stage_config import RecommendationConfig

try:
    from benchmarks._args import REPEATABLE, OnOff, ZeroOrMore, package_fields, parse
except ModuleNotFoundError:  # run as a file: its folder is on sys.path, not the repository
    from _args import REPEATABLE, OnOff, ZeroOrMore, package_fields, parse


def _setter(stage: str, config: str, examples: str) -> dict:
    return {
        "help": f"FIELD=VALUE: any {config} field of {stage} (VALUE read as JSON, else as text), e.g. {examples}; "
        "repeatable",
    } | REPEATABLE


@dataclass
class Settings:
    """What this run changes of the preset that no package dataclass declares: the output, the catalogue, each
    stage's budget as steps or minutes, the evaluated users, SASRec's minutes, and the setters of the stages'
    other fields. None (a flag left out) keeps the preset's value; the package's settings are parsed beside
    these (:data:`PARTS`), the preset's values their defaults."""

    out: str = field(metadata={"help": "the demo's output folder (resumed when it exists)"})
    dataset: str = field(
        default="movielens-100k",
        metadata={
            "help": "the catalogue (load_catalogue: a name or a folder such as ../shared/data/amazon-office)"
        },
    )
    sft_steps: int | None = field(default=None, metadata={"help": "SFT steps"})
    sft_minutes: float | None = field(default=None, metadata={"help": "a time budget instead of steps"})
    grounding_steps: int | None = field(default=None, metadata={"help": "grounding steps"})
    grounding_minutes: float | None = field(default=None, metadata={"help": "a time budget instead of steps"})
    users: int | None = field(default=None, metadata={"help": "test users evaluated (0: all)"})
    exclude_history: bool | None = field(
        default=None,
        metadata={
            "help": "the LLM's lists without the user's history items, as the peers' (--no-exclude-history: kept; "
            "None: the preset's)",
            "action": OnOff,
        },
    )
    sasrec_minutes: float | None = field(default=None, metadata={"help": "SASRec's time budget"})
    sft_set: list[str] = field(
        default_factory=list,
        metadata=_setter(
            "SFT",
            "RecommendationConfig",
            "learning_rate=1e-3, sid_softmax=false (the full head), weight_decay=0.05, padding_free=false, "
            "augment_views=2",
        ),
    )
    grounding_set: list[str] = field(
        default_factory=list,
        metadata=_setter("grounding", "GroundingConfig", "learning_rate=3e-3, weight_decay=0.01"),
    )


# the fields of the package's settings dataclasses this run may change, as the package declares them
ModelFields = package_fields(LoraModelConfig, "layers", "lora_r", "lora_alpha", "lora_dropout")
SIDFields = package_fields(BuildSIDsArguments, "codes", "balanced")
PromptFields = package_fields(SFTArguments, "max_history")
RunnerFields = package_fields(
    Budget,
    "eval_parts",
    "eval_every",
    "keep_best",
    "block_lr",
    "curve_every",
    "curve_users",
    "max_train_examples",
)
PeerFields = package_fields(Preset, "peers", parser={"peers": {"action": ZeroOrMore}})
DemoFields = package_fields(DemoArguments, "strategies", "precision", "no_diagnostics")
SeedFields = package_fields(RecommendationConfig, "seed")
# parsed beside Settings, in this order (parse_args' and preset's parts)
PARTS = (
    ItemVectorsConfig,
    RowStart,
    ModelFields,
    SIDFields,
    PromptFields,
    RunnerFields,
    PeerFields,
    DemoFields,
    SeedFields,
)


def preset_defaults(base: Preset) -> dict:
    """The preset's values of the package's fields parsed here: their defaults (a flag left out keeps them)."""
    budget = base.budget
    return (
        asdict(base.item_vectors)
        | asdict(budget.start)
        | dict(
            layers=base.layers,
            lora_r=budget.lora["r"],
            lora_alpha=None,  # the preset's alpha / r kept (its alpha at its r)
            lora_dropout=budget.lora["lora_dropout"],
            codes=str(base.codes),
            balanced=base.balanced,
            max_history=base.prompt_format().max_history,
            peers=list(base.peers),
            seed=base.seeds[0],
        )
        | {name: getattr(budget, name) for name in RunnerFields.__dataclass_fields__}
        | {"eval_parts": None if budget.eval_parts is None else list(budget.eval_parts)}
    )


def parse_args(argv=None) -> tuple:
    """The settings and the package's settings parsed beside them (:data:`PARTS`), the preset's unless changed:
    ``preset(*parse_args(argv))`` is the run's preset."""
    return parse(
        (Settings, *PARTS),
        argv,
        prog="bench_demo_recipe.py",
        description=__doc__,
        check=preset,
        defaults=preset_defaults(PRESETS["default"]),
    )


def _stage(config, steps: int | None, minutes: float | None, **more):
    """``config`` with the budget given (None: kept) and the fields ``more``."""
    changes = dict(more)
    if minutes is not None:
        changes |= dict(max_steps=0, max_minutes=minutes)  # the time alone ends the stage
    elif steps is not None:
        changes |= dict(max_steps=steps, max_minutes=None)
    return replace(config, **changes)


def _field_values(pairs: list[str], flag: str) -> dict[str, object]:
    """``FIELD=VALUE`` pairs of ``--sft-set`` / ``--grounding-set``: each value as JSON (numbers, true, null), else
    as text. The seed is every stage's and the evaluation's (``--seed``), never one stage's."""
    import json

    values = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise SystemExit(f"{flag} takes FIELD=VALUE, got {pair!r}")
        if name == "seed":
            raise SystemExit(f"{flag} seed={value}: give --seed (every stage's and the evaluation's)")
        try:
            values[name] = json.loads(value)
        except json.JSONDecodeError:
            values[name] = value
    return values


def preset(
    args: Settings,
    vectors: ItemVectorsConfig,
    start: RowStart,
    model,
    sids,
    prompt,
    runner,
    peers,
    demo,
    seed,
) -> Preset:
    """The ``default`` preset with the arguments' changes (built and checked before any work): ``vectors``, the
    SIDs' item vectors; ``start``, how the rows start (its ``init`` is each strategy's); the package's fields
    parsed beside them (:data:`PARTS`)."""
    base = PRESETS["default"]
    old = base.budget
    if start.init != old.start.init:
        raise SystemExit(
            f"--init {start.init}: each strategy starts its rows its own way; choose --strategies"
        )
    alpha = model.lora_alpha
    if alpha is None:  # the preset's scaling alpha / r, at this r
        alpha = round(old.lora["lora_alpha"] * model.lora_r / old.lora["r"])
    lora = LoraModelConfig(**(asdict(model) | {"lora_alpha": alpha}))  # checks --layers
    evaluation = old.evaluation if args.users is None else replace(old.evaluation, users=args.users or None)
    if args.exclude_history is not None:
        evaluation = replace(evaluation, exclude_history=args.exclude_history)
    changes = asdict(runner)
    if changes["eval_parts"] is not None:
        changes["eval_parts"] = tuple(changes["eval_parts"])
    grounding = _field_values(args.grounding_set, "--grounding-set")
    budget = replace(
        old,
        grounding=_stage(old.grounding, args.grounding_steps, args.grounding_minutes, **grounding),
        sft=_stage(old.sft, args.sft_steps, args.sft_minutes, **_field_values(args.sft_set, "--sft-set")),
        evaluation=evaluation,
        start=start,
        lora=old.lora | {"r": lora.lora_r, "lora_alpha": lora.lora_alpha, "lora_dropout": lora.lora_dropout},
        **changes,
    )
    spec = replace(
        base,
        budget=budget,
        layers=lora.layers,
        codes=BuildSIDsArguments.code_counts(sids),  # the package's reading of --codes
        balanced=sids.balanced,
        item_vectors=vectors,
        peers=tuple(peers.peers),
    )
    if (seed.seed,) != spec.seeds:
        spec = replace(spec, seeds=(seed.seed,))
    if prompt.max_history != spec.prompt_format().max_history:
        spec = replace(spec, fmt=replace(spec.prompt_format(), max_history=prompt.max_history))
    if args.sasrec_minutes is not None:
        spec = replace(spec, sasrec={"max_minutes": args.sasrec_minutes})
    strategies = DemoArguments(**asdict(demo)).strategies  # checked: each a known strategy
    if strategies:
        spec = replace(spec, strategies=tuple(strategies))
    return spec


def main(argv=None) -> None:
    from peft_grounded.pipeline.demo import run_demo

    settings = parse_args(argv)
    args, demo = settings[0], settings[1 + PARTS.index(DemoFields)]
    started = time.perf_counter()
    run_demo(
        preset(*settings),
        args.out,
        catalogue=args.dataset,
        precision=demo.precision,
        diagnostics=not demo.no_diagnostics,
    )
    print(f"demo wall time: {time.perf_counter() - started:.1f} s ({', '.join(map(str, settings))})")


if __name__ == "__main__":
    main()
