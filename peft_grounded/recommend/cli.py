"""``peft-grounded sft``: recommendation SFT (LoRA + the new rows) from the command line
(:func:`~.trainer.train_recommender`)."""

from __future__ import annotations

from typing import Any

from ..cli_common import add_data_args, add_format_args, add_init_args, add_training_args


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

    from ..adapter.lora import lora_settings
    from ..cli_common import load_data, prompt_format, trainer_kwargs
    from ..training import check_max_examples
    from .trainer import RecommendationConfig, train_recommender

    config = RecommendationConfig(**trainer_kwargs(args))  # settings checked before anything loads
    targets = args.lora_target_modules
    targets = targets if targets == "all-linear" else [t.strip() for t in targets.split(",") if t.strip()]
    lora = lora_settings(args.lora_r, args.lora_alpha, args.lora_dropout, targets)
    check_max_examples(args.max_examples)
    fmt = prompt_format(args)
    catalogue, index = load_data(args)
    train_recommender(
        catalogue,
        index,
        config,
        model_path=args.model,
        grounded=args.grounded,
        init=args.init,
        centroid_variant=args.centroid_variant,
        lora=lora,
        fmt=fmt,
        max_examples=args.max_examples,
        resume=args.resume,
        dtype=getattr(torch, args.weights_dtype),
    )
    print(f"recommender adapter: {args.output}/adapter")
    return 0
