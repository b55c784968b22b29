"""The demo's default preset with one recipe changed: a shallower base, the SID-only softmax, other budgets.

    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
      python benchmarks/bench_demo_recipe.py --out runs/demo-l8 --layers 8 --sid-softmax

Runs ``peft_grounded.pipeline.demo.run_demo`` (SIDs, the strategies, peers, report) with the ``default``
preset's settings except those given here, and prints the wall time; the report is ``<out>/report.md``.
Budgets are minutes (as the demo) or, with ``--sft-steps`` / ``--grounding-steps``, steps (so that a busy
machine cannot change them). Issue 28, item 4: a recipe that shows the start's effect on any CPU.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from peft_grounded._scripts import parse_script_args


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench_demo_recipe.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the demo's output folder (resumed when it exists)")
    p.add_argument("--layers", type=int, default=0, help="keep the base's first N blocks (0: all 30)")
    p.add_argument("--sid-softmax", action="store_true", help="SFT with the SID-only softmax")
    p.add_argument("--sft-minutes", type=float, default=3.0)
    p.add_argument("--sft-steps", type=int, default=0, help="a step budget instead of --sft-minutes")
    p.add_argument("--grounding-minutes", type=float, default=1.5)
    p.add_argument("--grounding-steps", type=int, default=0, help="a step budget instead of minutes")
    p.add_argument("--grounding-lr", type=float, default=5e-3)
    p.add_argument("--sft-lr", type=float, default=1e-3)
    p.add_argument("--users", type=int, default=150, help="test users evaluated")
    p.add_argument("--sasrec-minutes", type=float, default=1.5)
    p.add_argument("--strategies", nargs="+", default=None, help="default: the preset's")
    p.add_argument("--precision", choices=("auto", "bf16", "fp32"), default="auto")
    p.add_argument("--no-diagnostics", action="store_true")
    return parse_script_args(p, argv, check=preset)


def preset(args: argparse.Namespace):
    """The ``default`` preset with the arguments' changes (built before any work)."""
    from peft_grounded.pipeline.budget import Budget
    from peft_grounded.pipeline.demo import PRESETS

    base = PRESETS["default"]
    old = base.budget
    steps_or_minutes = lambda steps, minutes: (  # noqa: E731
        dict(max_steps=steps, max_minutes=None) if steps else dict(max_steps=0, max_minutes=minutes)
    )
    budget = Budget.from_training(
        grounding=dict(
            **steps_or_minutes(args.grounding_steps, args.grounding_minutes), learning_rate=args.grounding_lr
        ),
        sft=dict(
            **steps_or_minutes(args.sft_steps, args.sft_minutes),
            learning_rate=args.sft_lr,
            sid_softmax_loss=args.sid_softmax,
        ),
        training=dict(
            per_device_train_batch_size=old.sft.per_device_train_batch_size,
            max_length=old.sft.max_length,
            bf16=old.sft.bf16,
            save_steps=old.sft.save_steps,
            logging_steps=old.sft.logging_steps,
        ),
        lora=dict(r=old.lora["r"], lora_alpha=old.lora["lora_alpha"]),
        evaluation=replace(old.evaluation, users=args.users),
        weights_dtype=old.weights_dtype,
        eval_parts=old.eval_parts,
        eval_every=old.eval_every,
        curve_every=old.curve_every,
        curve_users=old.curve_users,
        max_grounding_examples=old.max_grounding_examples,
    )
    spec = replace(base, budget=budget, layers=args.layers, sasrec={"max_minutes": args.sasrec_minutes})
    if args.strategies:
        spec = replace(spec, strategies=tuple(args.strategies))
    return spec


def main(argv=None) -> None:
    from peft_grounded.pipeline.demo import run_demo

    args = parse_args(argv)
    started = time.perf_counter()
    run_demo(preset(args), args.out, precision=args.precision, diagnostics=not args.no_diagnostics)
    print(f"demo wall time: {time.perf_counter() - started:.1f} s ({vars(args)})")


if __name__ == "__main__":
    main()
