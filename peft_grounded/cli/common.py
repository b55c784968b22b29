"""Arguments the stage commands share (model, SID index, catalogue, prompt format, training budget)."""

from __future__ import annotations

import argparse
from typing import Any


def column_mapping(text: str) -> dict[str, str]:
    """``"item_id=asin,title=name"`` -> ``{"item_id": "asin", "title": "name"}``."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"{part!r} is not FIELD=COLUMN")
        out[key.strip()] = value.strip()
    return out


def add_data_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("model and data")
    g.add_argument(
        "--model", default=None, help="local base model directory (default: the packaged SmolLM2-135M)"
    )
    g.add_argument(
        "--sid-index",
        "--sids",
        dest="sid_index",
        required=True,
        help="SID index directory (from `peft-grounded build-sids`)",
    )
    g.add_argument(
        "--catalogue",
        default="movielens-100k",
        help="catalogue path or 'movielens-100k' (the one the SID index was built from)",
    )


def add_format_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("prompt format")
    g.add_argument(
        "--objective",
        choices=["prompt", "sequence"],
        default="prompt",
        help="prompt: an instruction prompt -> the next SID (the papers' setting); sequence: the history as "
        "SIDs only, every item a target (~10x the targets per second)",
    )
    g.add_argument(
        "--max-history",
        type=int,
        default=None,
        help="items of history in a prompt (default: 10 for prompt, 19 for sequence: chunks of 20 items)",
    )
    g.add_argument("--with-titles", action="store_true", help="show titles next to the history's SIDs")
    g.add_argument(
        "--prefix", default="", help="sequence objective: a short instruction after the start token"
    )


def add_training_args(parser: argparse.ArgumentParser, steps: int, lr: float) -> None:
    g = parser.add_argument_group("training")
    g.add_argument(
        "--output",
        "--out",
        dest="output",
        required=True,
        help="output directory (checkpoints, adapter/, run.json, logs)",
    )
    g.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"optimisation steps (default: {steps}; with --minutes: no step limit)",
    )
    g.add_argument(
        "--minutes",
        type=float,
        default=None,
        help="training-time budget: stop after this many minutes, the learning rate warming up and then "
        "decaying linearly to 0 at the limit (with --steps too: whichever comes first)",
    )
    g.add_argument("--batch-size", type=int, default=16)
    g.add_argument("--grad-accum", type=int, default=1)
    g.add_argument("--lr", type=float, default=lr)
    g.add_argument(
        "--lr-scheduler",
        choices=["cosine", "linear", "constant_with_warmup"],
        default="cosine",
        help="learning-rate schedule over --steps, after a warm-up (with --minutes the schedule is linear "
        "over the time; default: %(default)s)",
    )
    g.add_argument("--max-length", type=int, default=256)
    g.add_argument("--bf16", action="store_true", help="bf16 mixed precision (CPU with AVX-512 bf16, or GPU)")
    g.add_argument(
        "--weights-dtype",
        choices=["float32", "bfloat16", "float16"],
        default="float32",
        help="dtype of the frozen base's weights (adapter weights always train in float32)",
    )
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--save-steps", type=int, default=100)
    g.add_argument("--max-examples", type=int, default=None, help="a seeded sample of the training examples")
    g.add_argument(
        "--resume",
        action="store_true",
        help="continue from the last checkpoint in --output (or start if there is none yet)",
    )
    parser.set_defaults(default_steps=steps)


def add_init_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("initialisation of the new rows")
    g.add_argument("--init", default="mean", choices=["mean", "gaussian", "random", "centroid"])
    g.add_argument(
        "--centroid-variant",
        default="items",
        choices=["items", "codebook"],
        help="centroid of the items under a code (items) or the code's codebook vector (codebook)",
    )


def load_data(args: argparse.Namespace) -> tuple[Any, Any]:
    """(catalogue, SID index) named by the arguments."""
    from ..sids import SIDIndex, load_catalogue

    return load_catalogue(args.catalogue), SIDIndex.load(args.sid_index)


def prompt_format(args: argparse.Namespace):
    from ..prompts import PromptFormat

    objective = getattr(args, "objective", "prompt")
    history = args.max_history if args.max_history is not None else (19 if objective == "sequence" else 10)
    return PromptFormat(
        max_history=history,
        with_titles=args.with_titles,
        objective=objective,
        prefix=getattr(args, "prefix", ""),
    )


def trainer_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    steps = args.steps if args.steps is not None else (-1 if args.minutes else args.default_steps)
    return dict(
        output_dir=args.output,
        max_steps=steps,
        max_minutes=args.minutes,
        per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=args.grad_accum,
        learning_rate=args.lr,
        lr_scheduler_type=args.lr_scheduler,
        max_length=args.max_length,
        bf16=args.bf16,
        seed=args.seed,
        save_steps=args.save_steps,
        logging_steps=10,
        use_cpu=not torch.cuda.is_available(),
    )
