"""``peft-grounded demo``: the whole pipeline on SmolLM2-135M and MovieLens-100K, offline."""

from __future__ import annotations

from typing import Any

from .common import add_output_dir


def add_cli(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "demo",
        help="build SIDs, run the initialisation strategies under one budget, compare them, write a report",
        description="Offline end to end: SmolLM2-135M (packaged GGUF) on MovieLens-100K (recbole wheel). "
        "Presets: default (2-core CPU, minutes), full (GPU), smoke (tests).",
    )
    p.add_argument("--preset", default="default", choices=["default", "full", "smoke"])
    add_output_dir(
        p, "report folder (reused to resume an interrupted run)", old=("--output",), default="runs/demo"
    )
    p.add_argument(
        "--strategies", nargs="+", help="subset of: mean gaussian random centroid gti centroid_gti"
    )
    p.add_argument("--seeds", nargs="+", type=int, help="seeds (default: the preset's)")
    p.add_argument("--model", help="another local base model directory")
    p.add_argument("--catalogue", default="movielens-100k", help="another catalogue (path)")
    p.add_argument("--no-resume", action="store_true", help="refuse to reuse an existing output folder")
    p.add_argument("--no-diagnostics", action="store_true", help="skip the geometry report")
    p.add_argument(
        "--precision",
        default="auto",
        choices=["auto", "bf16", "fp32"],
        help="auto (default): the preset's bf16 where the CPU or GPU runs bf16 natively, float32 where it is "
        "emulated (many times slower); bf16 / fp32: force one",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from ..pipeline.demo import run_demo

    run_demo(
        args.preset,
        args.output_dir,
        strategies=tuple(args.strategies or ()),
        seeds=tuple(args.seeds or ()),
        model=args.model,
        catalogue=args.catalogue,
        resume=not args.no_resume,
        diagnostics=not args.no_diagnostics,
        precision=args.precision,
    )
    return 0
