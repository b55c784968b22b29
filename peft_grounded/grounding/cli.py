"""``peft-grounded ground``: the grounding stage from the command line."""

from __future__ import annotations

from typing import Any

from ..cli_common import add_data_args, add_init_args, add_training_args


def add_cli(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "ground",
        help="ground the new SID tokens (train only their rows on text <-> SID pairs, backbone frozen)",
        description="Add the SID index's tokens to the model, initialise their rows, and train only those rows "
        "on the six GTI text <-> SID templates through TRL's SFTTrainer. Writes OUTPUT/adapter.",
    )
    add_data_args(p)
    add_init_args(p)
    add_training_args(p, steps=200, lr=1e-3)
    p.add_argument("--max-examples", type=int, default=None, help="sample of the grounding pairs")
    p.set_defaults(func=run)


def run(args) -> int:
    from peft import get_peft_model

    from ..adapter import add_tokens
    from ..cli_common import grounded_config, load_data, model_path, trainer_kwargs
    from ..recommend.runner import load_base, sample_rows
    from . import GroundingConfig, GroundingTrainer, grounding_dataset

    catalogue, index = load_data(args)
    tokenizer, base = load_base(model_path(args))
    added = add_tokens(tokenizer, base, index.token_strings)
    model = get_peft_model(base, grounded_config(args, added, index))
    data = sample_rows(grounding_dataset(catalogue, index, tokenizer), args.max_examples, args.seed)
    trainer = GroundingTrainer(
        model, GroundingConfig(**trainer_kwargs(args)), train_dataset=data, processing_class=tokenizer
    )
    trainer.train(resume_from_checkpoint=True if args.resume else None)
    print(f"grounded adapter: {args.output}/adapter")
    return 0
