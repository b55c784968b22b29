"""The demo's default preset with one recipe changed: depth, softmax, start, budgets, learning rates, users.

    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
      python benchmarks/bench_demo_recipe.py --out runs/demo-full-head --no-sid-softmax

Runs ``peft_grounded.pipeline.demo.run_demo`` (SIDs, the strategies, peers, report) with the ``default``
preset's settings except those given here, and prints the wall time; the report is ``<out>/report.md``.
``--dataset`` runs the same recipe on another catalogue (Amazon Office: ``--dataset
../shared/data/amazon-office``). Budgets are steps (``--sft-steps``; a busy machine cannot change them)
or, with ``--sft-minutes`` / ``--grounding-minutes``, minutes. Every flag left out keeps the preset's value.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from peft_grounded._scripts import parse_script_args


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench_demo_recipe.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the demo's output folder (resumed when it exists)")
    p.add_argument(
        "--dataset",
        default="movielens-100k",
        help="the catalogue (load_catalogue: a name or a folder such as ../shared/data/amazon-office)",
    )
    p.add_argument("--layers", type=int, default=None, help="keep the base's first N blocks (0: all 30)")
    p.add_argument(
        "--sid-softmax",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="SFT with the SID-only softmax (--no-sid-softmax: the full head)",
    )
    p.add_argument("--init-scale", type=float, default=None, help="GroundedTokenConfig.init_scale")
    p.add_argument("--lora-r", type=int, default=None, help="the stacked LoRA's rank (alpha: twice it)")
    p.add_argument(
        "--lora-dropout",
        type=float,
        default=None,
        help="the stacked LoRA's dropout (default: the preset's 0)",
    )
    p.add_argument(
        "--block-lr",
        type=float,
        default=None,
        help="full fine-tuning of the kept blocks at this learning rate instead of the stacked LoRA (a "
        "reference row: decoded in place, so no --keep-best and no resume)",
    )
    p.add_argument("--weight-decay", type=float, default=None, help="AdamW weight decay of SFT")
    p.add_argument(
        "--padding-free",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="SFT on padding-free batches (--no-padding-free: padded; default: the trainer's choice)",
    )
    p.add_argument("--codes", type=int, default=None, help="codes per SID level (default: the preset's 64)")
    p.add_argument(
        "--balanced",
        choices=("none", "last", "all"),
        default=None,
        help="balanced RQ-KMeans levels of the SIDs (default: the preset's none)",
    )
    p.add_argument(
        "--item-vectors",
        choices=("text", "behaviour", "mix"),
        default=None,
        help="what the SIDs and the centroid start are built from (default: the preset's text)",
    )
    p.add_argument(
        "--behaviour-weight", type=float, default=None, help="--item-vectors mix: behaviour's share"
    )
    p.add_argument("--history", type=int, default=None, help="items of history per training window")
    p.add_argument("--curve-every", type=int, default=None, help="validation NLL every N steps")
    p.add_argument(
        "--eval-every", type=int, default=None, help="validation Recall@10 every N SFT steps (0: off)"
    )
    p.add_argument("--curve-users", type=int, default=None, help="validation users of both curves")
    p.add_argument(
        "--keep-best",
        action="store_true",
        help="end SFT with the adapter of the best validation Recall@10 (early stopping; needs --eval-every)",
    )
    p.add_argument("--sft-steps", type=int, default=None)
    p.add_argument("--sft-minutes", type=float, default=None, help="a time budget instead of steps")
    p.add_argument("--grounding-steps", type=int, default=None)
    p.add_argument("--grounding-minutes", type=float, default=None, help="a time budget instead of steps")
    p.add_argument("--grounding-lr", type=float, default=None)
    p.add_argument("--sft-lr", type=float, default=None)
    p.add_argument("--users", type=int, default=None, help="test users evaluated (0: all)")
    p.add_argument(
        "--exclude-history",
        action="store_true",
        help="leave the user's history items out of the LLM's lists (as the peers do)",
    )
    p.add_argument("--eval-parts", nargs="+", choices=("valid", "test"), default=None, help="parts decoded")
    p.add_argument("--peers", nargs="*", default=None, help="the peers scored (none: --peers alone)")
    p.add_argument("--sasrec-minutes", type=float, default=None)
    p.add_argument("--strategies", nargs="+", default=None)
    p.add_argument(
        "--sft-set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="any RecommendationConfig field of SFT (VALUE read as JSON, else as text), e.g. augment_views=2, "
        "neftune_noise_alpha=5; repeatable",
    )
    p.add_argument(
        "--max-train-examples",
        type=int,
        default=None,
        help="SFT on a seeded sample of this many training rows",
    )
    p.add_argument("--seed", type=int, default=None, help="the run's seed (default: the preset's)")
    p.add_argument("--precision", choices=("auto", "bf16", "fp32"), default="auto")
    p.add_argument("--no-diagnostics", action="store_true")
    return parse_script_args(p, argv, check=preset)


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


def preset(args: argparse.Namespace):
    """The ``default`` preset with the arguments' changes (built and checked before any work)."""
    from peft_grounded.pipeline.demo import PRESETS

    base = PRESETS["default"]
    old = base.budget
    sft_changes = {} if args.sid_softmax is None else {"sid_softmax_loss": args.sid_softmax}
    if args.weight_decay is not None:
        sft_changes["weight_decay"] = args.weight_decay
    if args.padding_free is not None:
        sft_changes["padding_free"] = args.padding_free
    sft_changes |= dict(_field_value(pair) for pair in args.sft_set)
    lora = old.lora if args.lora_r is None else old.lora | {"r": args.lora_r, "lora_alpha": 2 * args.lora_r}
    if args.lora_dropout is not None:
        lora = lora | {"lora_dropout": args.lora_dropout}
    evaluation = old.evaluation if args.users is None else replace(old.evaluation, users=args.users or None)
    if args.exclude_history:
        evaluation = replace(evaluation, exclude_history=True)
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
        init_scale=old.init_scale if args.init_scale is None else args.init_scale,
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
    if args.item_vectors is not None or args.behaviour_weight is not None:
        vectors = {"item_vectors": args.item_vectors or spec.item_vectors.item_vectors}
        if args.behaviour_weight is not None:
            vectors["behaviour_weight"] = args.behaviour_weight
        spec = replace(spec, item_vectors=replace(spec.item_vectors, **vectors))
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

    args = parse_args(argv)
    started = time.perf_counter()
    run_demo(
        preset(args),
        args.out,
        catalogue=args.dataset,
        precision=args.precision,
        diagnostics=not args.no_diagnostics,
    )
    print(f"demo wall time: {time.perf_counter() - started:.1f} s ({vars(args)})")


if __name__ == "__main__":
    main()
