"""``peft-grounded demo``: the whole pipeline on SmolLM2-135M and MovieLens-100K, offline.

The flags are the fields of :class:`DemoArguments`, parsed by TRL's parser; ``--config FILE.yaml`` gives any.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .common import Command, csv_list

STRATEGIES = ("mean", "gaussian", "random", "centroid", "gti", "centroid_gti", "peft_default")


@dataclass
class DemoArguments:
    """The preset, where the report goes, and what to run."""

    preset: Literal["default", "full", "smoke"] = field(
        default="default",
        metadata={"help": "default: a 2-core CPU; full: a GPU; smoke: tests."},
    )
    output_dir: str = field(
        default="runs/demo",
        metadata={"help": "Report folder (reused to resume an interrupted run)."},
    )
    strategies: list[str] = field(
        default_factory=list,
        metadata={"help": f"Subset of: {' '.join(STRATEGIES)} (spaces or commas); none: the preset's."},
    )
    seeds: list[int] = field(default_factory=list, metadata={"help": "Seeds; none: the preset's."})
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "Another local base model directory."}
    )
    catalogue: str = field(default="movielens-100k", metadata={"help": "Another catalogue (path)."})
    no_resume: bool = field(default=False, metadata={"help": "Refuse to reuse an existing output folder."})
    no_diagnostics: bool = field(default=False, metadata={"help": "Skip the geometry report."})
    precision: Literal["auto", "bf16", "fp32"] = field(
        default="auto",
        metadata={
            "help": "auto: the preset's bf16 where the CPU or GPU runs bf16 natively, float32 where it is "
            "emulated (many times slower); bf16 / fp32: force one."
        },
    )

    def __post_init__(self) -> None:
        self.strategies = csv_list(self.strategies)
        if self.strategies:
            from ..pipeline.budget import strategy

            for name in self.strategies:
                strategy(name)  # an unknown name: "Unknown strategy ...; choose from ..."


def run(args: DemoArguments) -> int:
    from ..pipeline.demo import run_demo

    run_demo(
        args.preset,
        args.output_dir,
        strategies=tuple(args.strategies),
        seeds=tuple(args.seeds),
        model=args.model_name_or_path,
        catalogue=args.catalogue,
        resume=not args.no_resume,
        diagnostics=not args.no_diagnostics,
        precision=args.precision,
    )
    return 0


COMMAND = Command(
    name="demo",
    help="build SIDs, run the initialisation strategies under one budget, compare them, write a report",
    description="Offline end to end: SmolLM2-135M (packaged GGUF) on MovieLens-100K (recbole wheel). Presets: "
    "default (2-core CPU), full (GPU), smoke (tests).",
    settings=lambda: (DemoArguments,),
    run=run,
)
