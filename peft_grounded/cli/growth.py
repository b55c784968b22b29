"""Growing a catalogue from the command line (see :mod:`peft_grounded.growth`):

* ``peft-grounded add-items``: a new version of a SID index with new items (:func:`~peft_grounded.growth.add_items`);
* ``peft-grounded grow-adapter``: a saved adapter grown onto that version
  (:func:`~peft_grounded.growth.grow_adapter`), optionally grounding the new items
  (:func:`~peft_grounded.growth.ground_new_items`).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .common import column_mapping

ADAPTER_CONFIG = "adapter_config.json"  # what PEFT's save_pretrained writes first


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
    p.add_argument("--overwrite", action="store_true", help="replace an adapter already in --output")
    p.set_defaults(func=run)


def check_output(output: Path, adapter: Path, overwrite: bool) -> None:
    """Raise ``ValueError`` unless ``output`` may receive the grown adapter (before anything is loaded)."""
    if output.resolve() == adapter.resolve():
        raise ValueError(
            f"--output is the trained adapter's directory ({adapter}); write the grown adapter elsewhere "
            "(the trained one stays loadable with the parent index)"
        )
    if not output.exists():
        return
    if not output.is_dir():
        raise ValueError(f"--output {output} is a file, not a directory; choose another --output")
    if (output / ADAPTER_CONFIG).is_file():
        if not overwrite:
            raise ValueError(
                f"{output} already holds an adapter; choose another --output, or pass --overwrite to "
                "replace it"
            )
    elif any(output.iterdir()):
        raise ValueError(
            f"{output} holds files but no adapter, and writing there would replace them; choose a new or "
            "empty --output"
        )


def run(args: argparse.Namespace) -> int:
    """Grow, optionally ground, save; prints a JSON summary and the output path."""
    import json
    import sys
    from contextlib import nullcontext

    import torch

    from ..adapter.loading import base_model_path, sid_model
    from ..growth.adapter import check_lineage, grow_adapter
    from ..growth.grounding import check_settings, ground_new_items, new_item_ids
    from ..sids import SIDIndex, load_catalogue
    from ..training.trainer import save_adapter_atomic

    output, adapter = Path(args.output), Path(args.adapter)
    check_output(output, adapter, args.overwrite)
    check_settings(  # before anything loads (checked with or without --ground: a typo is a typo)
        rows=args.rows,
        replay=args.replay,
        steps=args.ground_steps,
        learning_rate=args.lr,
        batch_size=args.batch_size,
        seed=args.seed,
    )
    parent, child = SIDIndex.load(args.parent_index), SIDIndex.load(args.sid_index)
    check_lineage(parent, child)  # the refusal grow_adapter gives, before the model is loaded
    catalogue = None
    if args.ground is not None:
        catalogue = load_catalogue(args.ground)
        new_ids = new_item_ids(parent, child)
        missing = [i for i in new_ids if i not in catalogue.items]
        if new_ids and len(missing) == len(new_ids):
            raise ValueError(
                f"--ground {args.ground} holds none of the {len(new_ids)} new items (e.g. {missing[0]!r}); "
                "pass the catalogue with their text (the one given to add-items, plus the old items for "
                "--replay)"
            )
        if missing:
            print(
                f"warning: {len(missing)} new items have no text in --ground; they are not grounded",
                file=sys.stderr,
            )

    tokenizer, model = sid_model(
        args.model or base_model_path(str(adapter)),
        parent,
        adapter=str(adapter),
        dtype=getattr(torch, args.weights_dtype),
    )
    grown = grow_adapter(model, tokenizer, parent, child, init=args.init)
    summary: dict[str, Any] = {
        "new_tokens": child.n_tokens - parent.n_tokens,
        "new_items": child.n_items - parent.n_items,
        "rows": child.n_tokens,
        "init": args.init,
        "fingerprint": child.fingerprint(),
    }
    if catalogue is not None:
        device = next(grown.parameters()).device.type
        if args.bf16:
            from ..precision import warn_if_emulated

            warn_if_emulated("bf16 grounding (--bf16)", device)
        autocast = torch.autocast(device, dtype=torch.bfloat16) if args.bf16 else nullcontext()
        with autocast:
            result = ground_new_items(
                grown,
                tokenizer,
                parent,
                child,
                catalogue,
                rows=args.rows,
                replay=args.replay,
                steps=args.ground_steps,
                learning_rate=args.lr,
                batch_size=args.batch_size,
                seed=args.seed,
            )
        summary["grounding"] = {
            "seconds": round(result.seconds, 3),
            "steps": len(result.losses),
            "examples": result.n_examples,
            "replayed": result.n_replayed,
            "trained_rows": len(result.trained_rows),
            "loss": [round(result.losses[0], 4), round(result.losses[-1], 4)] if result.losses else None,
        }
    save_adapter_atomic(grown, output)
    print(json.dumps(summary))
    print(f"saved to {output}")
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
    p.add_argument(
        "--format", default="auto", choices=["auto", "lcrec", "amazon", "movielens", "recbole", "table"]
    )
    p.add_argument(
        "--item-columns", type=column_mapping, help="table format: FIELD=COLUMN,... (item_id, title, ...)"
    )
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
    p.add_argument("--drop-empty-text", action="store_true", help="leave out new items whose text is empty")
    p.add_argument("--batch-size", type=int, default=64, help="encoder batch size (default: %(default)s)")
    p.add_argument("--cache-dir", help="embedding cache (default: ~/.cache/peft_grounded/embeddings)")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the embedding cache")
    p.add_argument("--device", default="cpu", help="torch device of the encoder (default: cpu)")
    p.add_argument("--output", "-o", required=True, help="directory of the new index version")
    p.add_argument("--overwrite", action="store_true", help="replace an index already in --output")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run_add_items)


def run_add_items(args: argparse.Namespace) -> int:
    import json
    import logging
    import sys
    from pathlib import Path

    from ..growth.index import GrowthError, GrowthReport, add_items, encoder_spec
    from ..sids.catalogue import CatalogueError
    from ..sids.index import JSON_NAME, SIDIndex

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    parent_dir, output = Path(args.sid_index).resolve(), Path(args.output).resolve()
    if parent_dir == output:
        print(
            "error: --output is the parent index's directory; write the new version elsewhere (the parent "
            "stays loadable for the adapters trained on it)",
            file=sys.stderr,
        )
        return 2
    if (output / JSON_NAME).is_file() and not args.overwrite:
        print(
            f"error: {output} already holds a SID index; adapters trained on it would no longer match. "
            "Choose another --output, or pass --overwrite to replace it",
            file=sys.stderr,
        )
        return 2
    report = GrowthReport()
    try:
        parent = SIDIndex.load(parent_dir)
        child = add_items(
            parent,
            args.catalogue,
            encoder=args.encoder or encoder_spec(parent),
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
    child.save(output)
    print(report.summary())
    print(json.dumps({"parent": child.parent, "fingerprint": child.fingerprint(), "n_items": child.n_items}))
    print(f"saved to {output}")
    return 0
