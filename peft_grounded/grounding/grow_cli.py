"""``peft-grounded grow-adapter``: grow a saved adapter onto an ``add-items`` index
(:func:`~peft_grounded.adapter.grow.grow_adapter`), optionally grounding the new items
(:func:`~peft_grounded.grounding.incremental.ground_new_items`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

ADAPTER_CONFIG = "adapter_config.json"  # what PEFT's save_pretrained writes first


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

    from ..adapter.grow import check_lineage, grow_adapter
    from ..models import base_model_path, sid_model
    from ..sids import SIDIndex, load_catalogue
    from ..training import save_adapter_atomic
    from .incremental import check_settings, ground_new_items, new_item_ids

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
