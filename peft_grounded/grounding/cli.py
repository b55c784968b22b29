"""``peft-grounded ground``: the grounding stage from the command line (:func:`~.trainer.ground`)."""

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
    p.set_defaults(func=run)


def run(args) -> int:
    import torch

    from ..cli_common import load_data, trainer_kwargs
    from ..training import check_max_examples
    from .trainer import GroundingConfig, ground

    config = GroundingConfig(**trainer_kwargs(args))  # settings checked before anything loads
    check_max_examples(args.max_examples)
    catalogue, index = load_data(args)
    ground(
        catalogue,
        index,
        config,
        model_path=args.model,
        init=args.init,
        centroid_variant=args.centroid_variant,
        max_examples=args.max_examples,
        resume=args.resume,
        dtype=getattr(torch, args.weights_dtype),
    )
    print(f"grounded adapter: {args.output}/adapter")
    return 0
