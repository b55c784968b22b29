"""``peft-grounded grow-adapter``: grow a saved adapter onto an ``add-items`` index
(:func:`~peft_grounded.adapter.grow.grow_adapter`), optionally grounding the new items
(:func:`~peft_grounded.grounding.incremental.ground_new_items`)."""

from __future__ import annotations

import argparse
from typing import Any


def add_cli(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "grow-adapter",
        help="grow a trained adapter onto an index made by add-items (new items without retraining)",
        description="Load the base with the parent index's tokens and the trained adapter, add the child "
        "index's new tokens (trained rows and LoRA carried over bit for bit, new rows from --init), "
        "optionally ground the new items' rows on their text <-> SID pairs (--ground), and save the grown "
        "adapter to --output (written beside it, then renamed into place).",
    )
    p.add_argument(
        "--adapter", required=True, help="the trained adapter's directory (trained on --parent-index)"
    )
    p.add_argument(
        "--parent-index", required=True, help="directory of the SID index the adapter was trained on"
    )
    p.add_argument(
        "--sid-index",
        "--sids",
        dest="sid_index",
        required=True,
        help="directory of the child index (from `peft-grounded add-items --sid-index PARENT`)",
    )
    p.add_argument("--output", "-o", required=True, help="directory of the grown adapter")
    p.add_argument(
        "--model",
        default=None,
        help="local base model directory (default: the base recorded in the adapter)",
    )
    p.add_argument(
        "--init",
        default="centroid",
        choices=["centroid", "mean", "gaussian", "random"],
        help="how the new tokens' rows start (default: %(default)s, the child's item centroids projected "
        "with the parent's tokens)",
    )
    p.add_argument(
        "--weights-dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="dtype of the frozen base's weights (adapter rows and LoRA stay float32; default: %(default)s)",
    )
    g = p.add_argument_group("incremental grounding (with --ground)")
    g.add_argument(
        "--ground",
        metavar="CATALOGUE",
        default=None,
        help="ground the new items' rows on this catalogue's text (any format build-sids reads; it needs "
        "the old items' text too for --replay, else pass --replay 0)",
    )
    g.add_argument(
        "--ground-steps",
        type=int,
        default=30,
        help="AdamW steps of incremental grounding (default: %(default)s)",
    )
    g.add_argument(
        "--replay",
        type=float,
        default=1.0,
        help="old items per new item whose pairs are mixed in (0: the new items alone; default: %(default)s)",
    )
    g.add_argument(
        "--rows",
        choices=["used", "new"],
        default="used",
        help="rows that train: every token a new item's SID uses (used, default) or only the new tokens",
    )
    g.add_argument("--lr", type=float, default=1e-3, help="learning rate (default: %(default)s)")
    g.add_argument("--batch-size", type=int, default=8, help="pairs per step (default: %(default)s)")
    g.add_argument("--seed", type=int, default=0, help="seed of the replay sample and the batch order")
    g.add_argument(
        "--bf16", action="store_true", help="ground under bf16 autocast (CPU with AVX-512 bf16, or GPU)"
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an adapter already in --output (its config, weights and PEFT's card; other files are kept)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Grow, optionally ground, save; prints a JSON summary and the output path."""
    import json

    from .grow_run import grow_adapter_into

    summary = grow_adapter_into(
        args.adapter,
        args.parent_index,
        args.sid_index,
        args.output,
        model=args.model,
        init=args.init,
        weights_dtype=args.weights_dtype,
        overwrite=args.overwrite,
        ground=args.ground,
        ground_steps=args.ground_steps,
        replay=args.replay,
        rows=args.rows,
        lr=args.lr,
        batch_size=args.batch_size,
        seed=args.seed,
        bf16=args.bf16,
    )
    print(json.dumps(summary))
    print(f"saved to {args.output}")
    return 0
