"""``peft-grounded build-sids``: catalogue -> item vectors -> RQ-KMeans -> SID index (see docs/sids.md)."""

from __future__ import annotations

import argparse
from typing import Any

from .common import add_catalogue_format_args, add_encoding_args, add_output_dir, column_mapping


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
    add_catalogue_format_args(g)
    g.add_argument("--reviews", help="Amazon: the reviews file (ratings) next to the metadata")
    g.add_argument("--interactions", help="table format: the interactions CSV/JSONL")
    g.add_argument(
        "--interaction-columns",
        type=column_mapping,
        help="table format: user_id=...,item_id=...,timestamp=...",
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
    add_encoding_args(g, device_help="torch device of the encoder and RQ-KMeans (default: cpu)")
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
    add_output_dir(p, "directory of the SID index", required=True)
    p.add_argument("--overwrite", action="store_true", help="replace an index already in --output")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import logging
    import sys

    from ..sids.build import build_sids
    from ..sids.catalogue import CatalogueError
    from ..sids.rqkmeans import QuantizationError
    from ..sids.text import TextTemplate

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
            args.output_dir,
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
    print(f"saved to {args.output_dir}")
    return 0
