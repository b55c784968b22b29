"""``peft-grounded sft``: recommendation SFT (LoRA + the new rows) from the command line."""

from __future__ import annotations

from typing import Any

from ..cli_common import add_data_args, add_init_args, add_training_args


def add_cli(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "sft",
        help="train the recommender: next-item SID prediction with a LoRA stacked on the grounded rows",
        description="Start the new rows from a grounded adapter (--grounded) or a fresh initialisation (--init), "
        "stack a LoRA, and train next-item SFT on the catalogue's leave-one-out training histories. "
        "Writes OUTPUT/adapter (rows + LoRA, one artefact).",
    )
    add_data_args(p)
    add_init_args(p)
    p.add_argument("--grounded", help="grounded adapter directory to start from (overrides --init)")
    add_training_args(p, steps=400, lr=5e-4)
    g = p.add_argument_group("LoRA")
    g.add_argument("--lora-r", type=int, default=16)
    g.add_argument("--lora-alpha", type=int, default=32)
    g.add_argument("--lora-dropout", type=float, default=0.05)
    g.add_argument(
        "--lora-target-modules", default="all-linear", help="'all-linear' or comma-separated names"
    )
    p.add_argument("--max-examples", type=int, default=None, help="sample of the training examples")
    p.set_defaults(func=run)


def run(args) -> int:
    from peft import PeftModel, get_peft_model

    from ..adapter import add_lora, add_tokens
    from ..cli_common import grounded_config, load_data, model_path, prompt_format, trainer_kwargs
    from . import RecommendationConfig, RecommendationTrainer, training_dataset
    from .runner import load_base, sample_rows

    catalogue, index = load_data(args)
    tokenizer, base = load_base(model_path(args))
    added = add_tokens(tokenizer, base, index.token_strings)
    if args.grounded:
        model = PeftModel.from_pretrained(base, args.grounded, is_trainable=True)
    else:
        model = get_peft_model(base, grounded_config(args, added, index))
    targets = args.lora_target_modules
    targets = targets if targets == "all-linear" else [t.strip() for t in targets.split(",") if t.strip()]
    add_lora(
        model,
        r=args.lora_r,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        target_modules=targets,
    )
    split = catalogue.leave_one_out()
    data = sample_rows(
        training_dataset(split, index, catalogue, tokenizer, prompt_format(args)),
        args.max_examples,
        args.seed,
    )
    trainer = RecommendationTrainer(
        model, RecommendationConfig(**trainer_kwargs(args)), train_dataset=data, processing_class=tokenizer
    )
    trainer.train(resume_from_checkpoint=True if args.resume else None)
    print(f"recommender adapter: {args.output}/adapter")
    return 0
