"""``peft-grounded sft``: recommendation SFT (LoRA + the new rows) from the command line
(:func:`~.trainer.train_recommender`)."""

from __future__ import annotations

from typing import Any

from .common import add_data_args, add_format_args, add_init_args, add_training_args


def add_cli(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "sft",
        help="train the recommender: next-item SID prediction with a LoRA stacked on the grounded rows",
        description="Start the new rows from a grounded adapter (--grounded) or a fresh initialisation (--init), "
        "stack a LoRA, and train next-item SFT on the catalogue's leave-one-out training histories. "
        "Writes OUTPUT/adapter (rows + LoRA, one artefact).",
    )
    add_data_args(p)
    add_format_args(p)
    add_init_args(p)
    p.add_argument("--grounded", help="grounded adapter directory to start from (overrides --init)")
    add_training_args(p, steps=400, lr=5e-4)
    g = p.add_argument_group("LoRA")
    g.add_argument("--lora-r", type=int, default=16)
    g.add_argument("--lora-alpha", type=int, default=32)
    g.add_argument("--lora-dropout", type=float, default=0.0)
    g.add_argument(
        "--lora-target-modules", default="all-linear", help="'all-linear' or comma-separated names"
    )
    p.set_defaults(func=run)


def run(args) -> int:
    import torch

    from ..recommend.trainer import RecommendationConfig, train_recommender
    from .common import load_data, prompt_format, trainer_kwargs

    catalogue, index = load_data(args)
    targets = args.lora_target_modules
    targets = targets if targets == "all-linear" else [t.strip() for t in targets.split(",") if t.strip()]
    lora = dict(
        r=args.lora_r, lora_alpha=args.lora_alpha, lora_dropout=args.lora_dropout, target_modules=targets
    )
    train_recommender(
        catalogue,
        index,
        RecommendationConfig(**trainer_kwargs(args)),
        model_path=args.model,
        grounded=args.grounded,
        init=args.init,
        centroid_variant=args.centroid_variant,
        lora=lora,
        fmt=prompt_format(args),
        max_examples=args.max_examples,
        resume=args.resume,
        dtype=getattr(torch, args.weights_dtype),
    )
    print(f"recommender adapter: {args.output}/adapter")
    return 0
