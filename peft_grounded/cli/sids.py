"""``peft-grounded build-sids``: catalogue -> item vectors -> RQ-KMeans -> SID index (see docs/sids.md).

The flags are the fields of :class:`BuildSIDsArguments`, :class:`~.common.CatalogueArguments`,
:class:`~.common.EncodingArguments` and :class:`~peft_grounded.sids.behaviour.ItemVectorsConfig`, parsed by TRL's parser; ``--config FILE.yaml`` gives any of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ..sids.behaviour import ItemVectorsConfig
from .common import CatalogueArguments, Command, EncodingArguments, column_mapping, recipe_field


@dataclass
class BuildSIDsArguments:
    """The catalogue, how its item texts are written, how they are quantised, and where the index goes."""

    output_dir: str = field(metadata={"help": "Directory of the SID index."})
    catalogue: str = field(
        default="movielens-100k",
        metadata={
            "help": "Path of the catalogue (LC-Rec dir/prefix, Amazon meta file, MovieLens dir, RecBole dir, "
            "CSV/JSONL) or 'movielens-100k' (the embedded data set)."
        },
    )
    reviews: str | None = field(
        default=None, metadata={"help": "Amazon: the reviews file (ratings) next to the metadata."}
    )
    interactions: str | None = field(
        default=None, metadata={"help": "table format: the interactions CSV/JSONL."}
    )
    interaction_columns: str | None = field(
        default=None, metadata={"help": "table format: user_id=...,item_id=...,timestamp=..."}
    )
    k_core: int = field(default=0, metadata={"help": "Keep the k-core of users and items (0: no filter)."})
    encoder: str = field(
        default="minilm",
        metadata={
            "help": "minilm (packaged all-MiniLM-L6-v2), st:PATH, lm:PATH (mean hidden states), lm-emb:PATH "
            "(mean input embeddings), smollm2, smollm2-emb."
        },
    )
    text_fields: str = field(
        default="title,brand,categories,description",
        metadata={"help": "Item fields to encode, in order (any standard field or extra column)."},
    )
    unlabelled: bool = field(default=False, metadata={"help": "Bare field values, no 'Title:' labels."})
    quantizer: Literal["rqkmeans", "rqvae"] = field(
        default="rqkmeans", metadata={"help": "Residual k-means or a trained RQ-VAE."}
    )
    rqvae_epochs: int = field(default=100, metadata={"help": "RQ-VAE training epochs."})
    levels: int | None = field(
        default=None, metadata={"help": "Number of levels; None: 3, or the length of --codes."}
    )
    codes: str = field(
        default="256", metadata={"help": "Codes per level: one number or a list (256,256,256)."}
    )
    dedup: Literal["level", "reassign", "none"] = field(
        default="level",
        metadata={
            "help": "Unique SIDs: an extra disambiguation level, re-assignment at the last level, or none."
        },
    )
    balanced: Literal["none", "last", "all"] = field(
        default="none",
        metadata={"help": "Cap each code at ceil(items / codes) items on no level, the last level, or all."},
    )
    normalize_residuals: bool = field(
        default=False, metadata={"help": "L2-normalise the residual before each level."}
    )
    seed: int = field(default=0, metadata={"help": "Seed of the k-means."})
    max_iter: int = field(default=30, metadata={"help": "Lloyd iterations per level at most."})
    sample_size: int | None = field(
        default=None, metadata={"help": "Fit the codebooks on this many items, then code all."}
    )
    overwrite: bool = field(default=False, metadata={"help": "Replace an index already in --output_dir."})
    recipe: str | None = recipe_field("build-sids")

    def __post_init__(self) -> None:
        self.code_counts()  # a bad --codes fails here, before any encoding
        if self.interaction_columns:
            column_mapping(self.interaction_columns)

    def code_counts(self) -> int | list[int]:
        """``--codes`` as build_sids takes it: one number, or one per level."""
        try:
            parts = [int(p) for p in self.codes.split(",") if p.strip()]
        except ValueError:
            parts = []
        if not parts or min(parts) < 1:
            raise ValueError(
                f"codes_per_level must be >= 1, got {self.codes!r} (--codes): give a positive number or a list "
                "such as 256,256,256"
            )
        return parts[0] if len(parts) == 1 else parts


def run(
    args: BuildSIDsArguments,
    catalogue: CatalogueArguments,
    encoding: EncodingArguments,
    item_vectors: ItemVectorsConfig,
) -> int:
    import logging

    from ..sids.build import build_sids
    from ..sids.catalogue import TextTemplate

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    options: dict[str, Any] = catalogue.catalogue_options()
    if args.reviews:
        options["reviews"] = args.reviews
    if args.interactions:
        options["interactions"] = args.interactions
    if args.interaction_columns:
        options["interaction_columns"] = column_mapping(args.interaction_columns)
    template = TextTemplate(
        fields=tuple(f.strip() for f in args.text_fields.split(",") if f.strip()),
        labelled=not args.unlabelled,
    )
    index = build_sids(
        args.catalogue,
        args.output_dir,
        catalogue_format=catalogue.catalogue_format,
        catalogue_options=options,
        encoder=args.encoder,
        text_template=template,
        levels=args.levels,
        codes=args.code_counts(),
        dedup=args.dedup,
        balanced=args.balanced,
        normalize_residuals=args.normalize_residuals,
        seed=args.seed,
        max_iter=args.max_iter,
        sample_size=args.sample_size,
        quantizer=args.quantizer,
        rqvae_epochs=args.rqvae_epochs,
        k_core=args.k_core,
        **encoding.keywords(),
        overwrite=args.overwrite,
        item_vectors=item_vectors,
    )
    print(index.summary())
    print(f"saved to {args.output_dir}")
    return 0


COMMAND = Command(
    name="build-sids",
    help="build Semantic IDs (RQ-KMeans over item-text embeddings) and the SID index",
    description="Encode each catalogue item's text, quantise with residual k-means, give every item a unique SID "
    "and save the SID index (codes, codebooks, per-token centroids, quality figures).",
    settings=lambda: (BuildSIDsArguments, CatalogueArguments, EncodingArguments, ItemVectorsConfig),
    run=run,
)
