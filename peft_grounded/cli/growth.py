"""Growing a catalogue from the command line (see :mod:`peft_grounded.growth`):

* ``peft-grounded add-items``: a new version of a SID index with new items (:func:`~peft_grounded.growth.add_items`);
* ``peft-grounded grow-adapter``: a saved adapter grown onto that version
  (:func:`~peft_grounded.growth.grow_adapter`), optionally grounding the new items
  (:func:`~peft_grounded.growth.ground_new_items`); :func:`peft_grounded.growth.run.grow_adapter_into` is the
  command as a function.
"""

from __future__ import annotations

import argparse
from typing import Any

from .common import add_catalogue_format_args, add_encoding_args, add_output_dir


def add_cli(subparsers: Any) -> None:
    add_items_cli(subparsers)
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
    add_output_dir(p, "directory of the grown adapter", required=True)
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
        "--interactions",
        default=None,
        help='JSONL of histories logged since the adapter was trained ({"user": ID, "history": [...]}, newest '
        "item last): fit the new-item rule on it and store it with the grown adapter, so that `recommend` serves "
        "the new items",
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

    from ..growth.run import grow_adapter_into

    summary = grow_adapter_into(
        args.adapter,
        args.parent_index,
        args.sid_index,
        args.output_dir,
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
        interactions=args.interactions,
    )
    print(json.dumps(summary))
    print(f"saved to {args.output_dir}")
    return 0


def add_items_cli(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "add-items",
        help="add new items to a SID index (a new version; existing SIDs unchanged)",
        description="Encode the new items with the index's encoder and text template, code them with its "
        "codebooks, resolve collisions through the disambiguation level (new tokens are appended) and write "
        "a new index version whose parent is the given one. Grow a trained adapter onto it with "
        "`peft-grounded grow-adapter` (or peft_grounded.growth.grow_adapter).",
    )
    p.add_argument("--sid-index", required=True, help="directory of the parent SID index")
    p.add_argument("--catalogue", required=True, help="the new items (any format build-sids reads)")
    add_catalogue_format_args(p)
    p.add_argument(
        "--encoder",
        help="the index's encoder as a build-sids spec (default: minilm when the index was built with the "
        "packaged MiniLM); another encoder is refused",
    )
    p.add_argument(
        "--skip-problems",
        action="store_true",
        help="leave out items already in the index or repeated in the batch (listed) instead of failing",
    )
    add_encoding_args(p)
    add_output_dir(p, "directory of the new index version", required=True)
    p.add_argument("--overwrite", action="store_true", help="replace an index already in --output")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run_add_items)


def run_add_items(args: argparse.Namespace) -> int:
    import json
    import logging
    import sys
    from pathlib import Path

    from ..growth.index import GrowthError, GrowthReport, add_items_to
    from ..sids.catalogue import CatalogueError

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    output = Path(args.output_dir).resolve()
    report = GrowthReport()
    try:
        child = add_items_to(
            args.sid_index,
            args.catalogue,
            output,
            overwrite=args.overwrite,
            encoder=args.encoder,
            on_problem="skip" if args.skip_problems else "error",
            empty_text="drop" if args.drop_empty_text else "error",
            batch_size=args.batch_size,
            cache_dir=args.cache_dir,
            use_cache=not args.no_cache,
            device=args.device,
            show_progress=not args.no_progress,
            catalogue_format=args.format,
            catalogue_options={"item_columns": args.item_columns} if args.item_columns else None,
            report=report,
        )
    except (CatalogueError, GrowthError, FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(report.summary())
    print(json.dumps({"parent": child.parent, "fingerprint": child.fingerprint(), "n_items": child.n_items}))
    print(f"saved to {output}")
    return 0
