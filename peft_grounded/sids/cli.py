"""``peft-grounded build-sids``: catalogue -> item vectors -> RQ-KMeans -> SID index (see docs/sids.md)."""

from __future__ import annotations

import argparse
from typing import Any


def _mapping(text: str) -> dict[str, str]:
    """``"item_id=asin,title=name"`` -> ``{"item_id": "asin", "title": "name"}``."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"{part!r} is not FIELD=COLUMN")
        out[key.strip()] = value.strip()
    return out


def _codes(text: str) -> int | list[int]:
    parts = [int(p) for p in text.split(",") if p.strip()]
    return parts[0] if len(parts) == 1 else parts


def add_cli(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "build-sids",
        help="build Semantic IDs (RQ-KMeans over item-text embeddings) and the SID index",
        description="Encode each catalogue item's text, quantise with residual k-means, give every item a "
        "unique SID and save the SID index (codes, codebooks, per-token centroids, quality figures).",
    )
    g = p.add_argument_group("catalogue")
    g.add_argument(
        "--catalogue",
        default="movielens-100k",
        help="path of the catalogue (LC-Rec dir/prefix, Amazon meta file, MovieLens dir, RecBole dir, "
        "CSV/JSONL) or 'movielens-100k' (default, the embedded data set)",
    )
    g.add_argument(
        "--format", default="auto", choices=["auto", "lcrec", "amazon", "movielens", "recbole", "table"]
    )
    g.add_argument("--reviews", help="Amazon: the reviews file (ratings) next to the metadata")
    g.add_argument("--interactions", help="table format: the interactions CSV/JSONL")
    g.add_argument(
        "--item-columns", type=_mapping, help="table format: FIELD=COLUMN,... (item_id, title, ...)"
    )
    g.add_argument(
        "--interaction-columns", type=_mapping, help="table format: user_id=...,item_id=...,timestamp=..."
    )
    g.add_argument("--k-core", type=int, default=0, help="keep the k-core of users and items (0: no filter)")
    g = p.add_argument_group("text and encoder")
    g.add_argument(
        "--encoder",
        default="minilm",
        help="minilm (packaged all-MiniLM-L6-v2, default), st:PATH, lm:PATH (mean hidden states), "
        "lm-emb:PATH (mean input embeddings), smollm2, smollm2-emb",
    )
    g.add_argument(
        "--text-fields",
        default="title,brand,categories,description",
        help="item fields to encode, in order (any standard field or extra column; default: %(default)s)",
    )
    g.add_argument("--unlabelled", action="store_true", help="bare field values, no 'Title:' labels")
    g.add_argument("--drop-empty-text", action="store_true", help="leave out items whose text is empty")
    g.add_argument("--batch-size", type=int, default=64, help="encoder batch size (default: %(default)s)")
    g.add_argument("--cache-dir", help="embedding cache (default: ~/.cache/peft_grounded/embeddings)")
    g.add_argument("--no-cache", action="store_true", help="neither read nor write the embedding cache")
    g.add_argument("--device", default="cpu", help="torch device of the encoder and RQ-KMeans (default: cpu)")
    g = p.add_argument_group("quantisation")
    g.add_argument(
        "--quantizer",
        default="rqkmeans",
        choices=["rqkmeans", "rqvae"],
        help="residual k-means (default) or a trained RQ-VAE",
    )
    g.add_argument(
        "--rqvae-epochs", type=int, default=100, help="RQ-VAE training epochs (default: %(default)s)"
    )
    g.add_argument("--levels", type=int, help="number of levels (default 3, or the length of --codes)")
    g.add_argument(
        "--codes", type=_codes, default=256, help="codes per level: one number or a list (256,256,256)"
    )
    g.add_argument(
        "--dedup",
        default="level",
        choices=["level", "reassign", "none"],
        help="unique SIDs: an extra disambiguation level (default), re-assignment at the last level, or none",
    )
    g.add_argument(
        "--balanced",
        default="none",
        choices=["none", "last", "all"],
        help="cap each code at ceil(items / codes) items on no level (default), the last level, or all levels",
    )
    g.add_argument(
        "--normalize-residuals", action="store_true", help="L2-normalise the residual before each level"
    )
    g.add_argument("--seed", type=int, default=0, help="seed of the k-means (default: %(default)s)")
    g.add_argument(
        "--max-iter", type=int, default=30, help="Lloyd iterations per level at most (default: %(default)s)"
    )
    g.add_argument("--sample-size", type=int, help="fit the codebooks on this many items, then code all")
    p.add_argument("--output", "-o", required=True, help="directory of the SID index")
    p.add_argument("--overwrite", action="store_true", help="replace an index already in --output")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)
    add_items_cli(subparsers)


def run(args: argparse.Namespace) -> int:
    import logging
    import sys

    from .build import build_sids
    from .catalogue import CatalogueError
    from .rqkmeans import QuantizationError
    from .text import TextTemplate

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    kwargs: dict[str, Any] = {}
    if args.reviews:
        kwargs["reviews"] = args.reviews
    if args.interactions:
        kwargs["interactions"] = args.interactions
    if args.item_columns:
        kwargs["item_columns"] = args.item_columns
    if args.interaction_columns:
        kwargs["interaction_columns"] = args.interaction_columns
    try:
        template = TextTemplate(
            fields=tuple(f.strip() for f in args.text_fields.split(",") if f.strip()),
            labelled=not args.unlabelled,
        )
        index = build_sids(
            args.catalogue,
            args.output,
            catalogue_format=args.format,
            catalogue_options=kwargs,
            encoder=args.encoder,
            text_template=template,
            levels=args.levels,
            codes=args.codes,
            dedup=args.dedup,
            balanced=args.balanced,
            normalize_residuals=args.normalize_residuals,
            seed=args.seed,
            max_iter=args.max_iter,
            sample_size=args.sample_size,
            quantizer=args.quantizer,
            rqvae_epochs=args.rqvae_epochs,
            k_core=args.k_core,
            empty_text="drop" if args.drop_empty_text else "error",
            batch_size=args.batch_size,
            cache_dir=args.cache_dir,
            use_cache=not args.no_cache,
            device=args.device,
            show_progress=not args.no_progress,
            overwrite=args.overwrite,
        )
    except (CatalogueError, QuantizationError, FileNotFoundError, FileExistsError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(index.summary())
    print(f"saved to {args.output}")
    return 0


def add_items_cli(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "add-items",
        help="add new items to a SID index (a new version; existing SIDs unchanged)",
        description="Encode the new items with the index's encoder and text template, code them with its "
        "codebooks, resolve collisions through the disambiguation level (new tokens are appended) and write "
        "a new index version whose parent is the given one. Grow a trained adapter onto it with "
        "`peft-grounded grow-adapter` (or peft_grounded.adapter.grow_adapter).",
    )
    p.add_argument("--sid-index", required=True, help="directory of the parent SID index")
    p.add_argument("--catalogue", required=True, help="the new items (any format build-sids reads)")
    p.add_argument(
        "--format", default="auto", choices=["auto", "lcrec", "amazon", "movielens", "recbole", "table"]
    )
    p.add_argument(
        "--item-columns", type=_mapping, help="table format: FIELD=COLUMN,... (item_id, title, ...)"
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

    from .catalogue import CatalogueError
    from .grow import GrowthError, GrowthReport, add_items_to

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    output = Path(args.output).resolve()
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
