"""From a catalogue (or ready vectors) to a :class:`~peft_grounded.sids.index.SIDIndex`: the Python twin of
``peft-grounded build-sids``.

:func:`encode_items` (below) turns a catalogue's items into vectors with a text template and an encoder.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._io import locks_output
from .behaviour import ItemVectorsConfig, behaviour_split
from .behaviour import item_vectors as build_item_vectors
from .catalogue import Catalogue, CatalogueError, Item, TextTemplate
from .catalogue_source import RECORD_KEY as CATALOGUE_RECORD
from .catalogue_source import CatalogueSource
from .collisions import (
    DEDUP_MODES,
    add_disambiguation_level,
    collision_stats,
    level_usage,
    reassign_last_level,
)
from .encoders import TextEncoder, encode_texts, load_encoder
from .index import DEFAULT_TEMPLATE, JSON_NAME, SIDIndex
from .kmeans import QuantizationError, check_vectors, cluster_sums
from .quantizers import RQKMeansConfig, RQVAEConfig, fit_rqkmeans

logger = logging.getLogger(__name__)

QUANTIZERS = ("rqkmeans", "rqvae")


def token_centroids(
    vectors: np.ndarray,
    codes: np.ndarray,
    codes_per_level: Sequence[int],
    codebooks: Sequence[np.ndarray],
    final_residual: np.ndarray,
) -> dict[str, np.ndarray]:
    """Both centroid variants (see :mod:`peft_grounded.sids.index`), rows in SID-vocabulary order."""
    x = torch.as_tensor(vectors, dtype=torch.float32)
    residual = torch.as_tensor(final_residual, dtype=torch.float32)
    global_mean = x.mean(0)
    items_rows, book_rows = [], []
    for level, k in enumerate(codes_per_level):
        labels = torch.as_tensor(codes[:, level], dtype=torch.int64)
        counts = torch.bincount(labels, minlength=k).to(torch.float32)[:, None]
        sums = cluster_sums(x, labels, k)
        means = torch.where(counts > 0, sums / counts.clamp_min(1), global_mean)
        items_rows.append(means)
        if level < len(codebooks):
            book_rows.append(torch.as_tensor(codebooks[level], dtype=torch.float32))
        else:  # disambiguation level: the mean final residual of the items holding the code
            res = cluster_sums(residual, labels, k)
            book_rows.append(torch.where(counts > 0, res / counts.clamp_min(1), torch.zeros_like(res)))
    return {"items": torch.cat(items_rows).numpy(), "codebook": torch.cat(book_rows).numpy()}


def index_from_vectors(
    vectors: np.ndarray | torch.Tensor,
    item_ids: Sequence[str],
    config: RQKMeansConfig | None = None,
    dedup: str = "level",
    encoder: Mapping[str, Any] | None = None,
    text_template: Mapping[str, Any] | None = None,
    item_interactions: np.ndarray | None = None,
    item_categories: Sequence[tuple[str, ...]] | None = None,
    token_template: str = DEFAULT_TEMPLATE,
    build_config: Mapping[str, Any] | None = None,
    quantizer: str = "rqkmeans",
    rqvae_config: RQVAEConfig | None = None,
) -> SIDIndex:
    """Quantise ``vectors`` (one row per item id) into a SID index with unique SIDs (``dedup``).

    ``quantizer="rqvae"`` trains an RQ-VAE (``rqvae_config``, by default with ``config``'s codes, seed
    and device) instead of RQ-KMeans; its codebooks, residuals and ``codebook`` centroids are then in the
    RQ-VAE's latent space, and ``mse`` is its reconstruction error in the item space."""
    if dedup not in DEDUP_MODES:
        raise ValueError(f"dedup must be one of {DEDUP_MODES}, got {dedup!r}")
    if quantizer not in QUANTIZERS:
        raise ValueError(f"quantizer must be one of {QUANTIZERS}, got {quantizer!r}")
    config = config or RQKMeansConfig()
    # the caller's tensor may live on a GPU or be bf16: the index is built from a float32 copy on the CPU
    x = check_vectors(vectors, what="item vectors").cpu()
    if x.shape[0] != len(item_ids):
        raise ValueError(f"{x.shape[0]} vectors for {len(item_ids)} item ids")
    start = time.perf_counter()
    if quantizer == "rqvae":
        from .quantizers import fit_rqvae

        vae_config = rqvae_config or RQVAEConfig(
            codes_per_level=config.codes_per_level, seed=config.seed, device=config.device
        )
        fit = fit_rqvae(x, vae_config)
        input_mse, level_errors, fit_stats = fit.input_mse, fit.level_mse, fit.stats
        codes_per_level = list(vae_config.codes_per_level)
    else:
        fit = fit_rqkmeans(x, config)
        input_mse, fit_stats = fit.input_mse, fit.stats
        level_errors = [e / input_mse if input_mse else 0.0 for e in fit.level_mse]
        codes_per_level = list(config.codes_per_level)
    codes = fit.codes.cpu().numpy()
    books = [b.cpu().numpy() for b in fit.codebooks]
    residual = fit.residual.cpu().numpy()
    before = collision_stats(codes)
    unresolved = 0
    if dedup == "reassign":
        entering = residual + books[-1][codes[:, -1]]
        codes, unresolved = reassign_last_level(codes, entering, books[-1])
        residual = entering - books[-1][codes[:, -1]]
    elif dedup == "level":
        codes = add_disambiguation_level(codes, (residual**2).sum(1))
        codes_per_level.append(int(codes[:, -1].max()) + 1)
        if codes_per_level[-1] > codes_per_level[-2]:
            logger.warning(
                "%d items share one SID, so the disambiguation level needs %d tokens (more than a k-means "
                "level); look for items with identical texts, or use more codes or levels",
                codes_per_level[-1],
                codes_per_level[-1],
            )
    after = collision_stats(codes)
    centroids = token_centroids(x.numpy(), codes, codes_per_level, books, residual)
    mse = fit.reconstruction_mse if quantizer == "rqvae" else float((residual**2).sum(1).mean())
    levels = [
        level_usage(codes[:, lv], k) | {"level": lv, "disambiguation": dedup == "level" and lv == len(books)}
        for lv, k in enumerate(codes_per_level)
    ]
    quality = {
        "n_items": len(item_ids),
        "dim": int(x.shape[1]),
        "dedup": dedup,
        "levels": levels,
        "collisions_before": before.as_dict(),
        "collisions_after": after.as_dict(),
        "unresolved_collisions": unresolved,
        "quantizer": quantizer,
        "input_mse": input_mse,
        "mse": mse,
        "relative_error": mse / input_mse if input_mse else 0.0,
        "relative_error_per_level": level_errors,
        "fit": fit_stats,
        "quantize_seconds": round(time.perf_counter() - start, 3),
    }
    if dedup == "reassign" and quantizer == "rqkmeans":
        quality["relative_error_per_level"][-1] = quality["relative_error"]
    settings = (asdict(vae_config) if quantizer == "rqvae" else asdict(config)) | {
        "codes_per_level": codes_per_level[: len(books)],
        "quantizer": quantizer,
        "dedup": dedup,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    return SIDIndex(
        item_ids=[str(i) for i in item_ids],
        codes=codes,
        codes_per_level=tuple(codes_per_level),
        codebooks=books,
        centroids=centroids,
        disambiguation_level=dedup == "level",
        normalize_residuals=config.normalize_residuals,
        token_template=token_template,
        encoder=dict(encoder or {}),
        text_template=None if text_template is None else dict(text_template),
        quality=quality,
        build_config=settings | dict(build_config or {}),
        item_interactions=None
        if item_interactions is None
        else np.asarray(item_interactions, dtype=np.int64),
        item_categories=None if item_categories is None else [tuple(c) for c in item_categories],
        quantizer=quantizer,
    )


class IndexExistsError(FileExistsError):
    """The output folder of a build holds a SID index already."""


def check_no_index(output: str | Path) -> None:
    """Raise :class:`IndexExistsError` if ``output`` holds a SID index (a build would replace it)."""
    if (Path(output) / JSON_NAME).is_file():
        raise IndexExistsError(
            f"{output} holds a SID index already; a new build would replace it, and the adapters trained on "
            "its SIDs would no longer match. Choose another output folder, or pass overwrite=True "
            "(--overwrite) to replace it."
        )


def _check_enough_items(config: RQKMeansConfig, n_items: int) -> None:
    """Every code needs an item: refuse more codes per level than items, with the fix."""
    k_max = max(config.codes_per_level)
    if k_max > n_items:
        raise QuantizationError(
            f"{k_max} codes per level but the catalogue has only {n_items} items; every code needs an item: "
            f"use codes <= {n_items} (e.g. --codes {2 ** int(np.log2(max(n_items, 1)))})"
        )


def _codes_per_level(levels: int | None, codes: int | Sequence[int]) -> tuple[int, ...]:
    if isinstance(codes, int):
        levels = 3 if levels is None else levels
        if levels < 1:
            raise ValueError(f"levels must be >= 1, got {levels} (--levels)")
        return (codes,) * levels
    per_level = tuple(int(c) for c in codes)
    if levels is not None and levels != len(per_level):
        raise ValueError(
            f"levels={levels} but codes lists {len(per_level)} levels ({list(per_level)}): give one of --levels "
            "and a list in --codes"
        )
    return per_level


@locks_output("output", "build-sids")
def build_sids(
    catalogue: Catalogue | str | Path = "movielens-100k",
    output: str | Path | None = None,
    *,
    encoder: TextEncoder | str | None = None,
    text_template: TextTemplate | str | Sequence[str] | None = None,
    vectors: np.ndarray | None = None,
    encoder_fingerprint: Mapping[str, Any] | None = None,
    levels: int | None = None,
    codes: int | Sequence[int] = 256,
    dedup: str = "level",
    balanced: str = "none",
    normalize_residuals: bool = False,
    seed: int = 0,
    max_iter: int = 30,
    sample_size: int | None = None,
    quantizer: str = "rqkmeans",
    rqvae_epochs: int = 100,
    k_core: int = 0,
    empty_text: str = "error",
    catalogue_format: str = "auto",
    catalogue_options: Mapping[str, Any] | None = None,
    batch_size: int = 64,
    cache_dir: str | Path | None = None,
    use_cache: bool = True,
    device: str = "cpu",
    token_template: str = DEFAULT_TEMPLATE,
    show_progress: bool = True,
    overwrite: bool = False,
    item_vectors: ItemVectorsConfig | None = None,
) -> SIDIndex:
    """Build (and, with ``output``, save) the SID index of a catalogue.

        ``catalogue``: a :class:`Catalogue`, a path, or ``"movielens-100k"``. ``encoder``: a
        :class:`TextEncoder` or a spec for :func:`~peft_grounded.sids.encoders.load_encoder` (default: the
        packaged all-MiniLM-L6-v2). ``vectors`` (one row per catalogue item, with ``encoder_fingerprint``)
        skips encoding. ``levels`` defaults to 3, or to the length of ``codes`` when it is a list. ``catalogue_format`` / ``catalogue_options`` go to
        :func:`~peft_grounded.sids.loaders.load_catalogue` when ``catalogue`` is a path. ``codes`` is per level (an int for all ``levels``, or a list). ``empty_text``:
        ``"error"`` or ``"drop"`` for items whose rendered text is empty. ``quantizer="rqvae"`` trains an RQ-VAE
    for ``rqvae_epochs`` instead of RQ-KMeans (then ``balanced``, ``normalize_residuals``, ``max_iter`` and
    ``sample_size`` do not apply). ``output`` holding an index already is an error (adapters trained on it
    need it) unless ``overwrite=True``. ``output`` is locked from the check to the save: a second build
    aimed at it stops at once (:class:`~peft_grounded._io.OutputBusyError`). ``item_vectors`` builds
    from behaviour or a mix instead of text (see :mod:`.behaviour`; the index keeps the text map). See
    ``docs/sids.md``.
    """
    if dedup not in DEDUP_MODES:
        raise ValueError(f"dedup must be one of {DEDUP_MODES}, got {dedup!r}")
    if quantizer not in QUANTIZERS:
        raise ValueError(f"quantizer must be one of {QUANTIZERS}, got {quantizer!r}")
    from .. import checks

    checks.raise_problems(
        "build_sids",
        [
            checks.int_at_least("batch_size", batch_size, 1, flag="--encode-batch-size"),
            checks.int_at_least("k_core", k_core, 0, flag="--k-core"),
            checks.int_at_least("rqvae_epochs", rqvae_epochs, 1, flag="--rqvae-epochs"),
            checks.one_of("empty_text", empty_text, ("error", "drop")),
        ],
    )
    if output is not None and not overwrite:
        check_no_index(output)
    config = RQKMeansConfig(
        codes_per_level=_codes_per_level(levels, codes),
        normalize_residuals=normalize_residuals,
        balanced=balanced,
        max_iter=max_iter,
        seed=seed,
        sample_size=sample_size,
        device=device,
    )
    source = None
    if not isinstance(catalogue, Catalogue):
        from .loaders import load_catalogue

        source = str(catalogue)
        catalogue = load_catalogue(catalogue, format=catalogue_format, **(catalogue_options or {}))
    read_from = CatalogueSource.of(catalogue, source, catalogue_format, dict(catalogue_options or {}), k_core)
    if output is not None:
        read_from = read_from.with_index_folder(output)
    logger.info("catalogue %s: %s", catalogue.name, catalogue.report.summary())
    if k_core > 1:
        catalogue = catalogue.k_core(k_core)
    template = text_template if isinstance(text_template, TextTemplate) else None
    if template is None:
        template = TextTemplate() if text_template is None else TextTemplate.from_spec(text_template)
    items = list(catalogue.items.values())
    if vectors is None:
        encoded = encode_items(
            items,
            template,
            encoder,
            empty_text=empty_text,
            fix="add fields (e.g. --text-fields title,brand,categories,description)",
            before_encoding=lambda kept, _: _check_enough_items(config, len(kept)),
            device=device,
            batch_size=batch_size,
            cache_dir=cache_dir,
            use_cache=use_cache,
            show_progress=show_progress,
        )
        if encoded.dropped:
            catalogue = catalogue.subset({it.item_id for it in encoded.items})
        items, vectors, dropped = encoded.items, encoded.vectors, len(encoded.dropped)
        fingerprint, encode_seconds = encoded.encoder.fingerprint(), encoded.seconds
    else:
        _check_enough_items(config, len(items))
        fingerprint = dict(encoder_fingerprint or {"kind": "precomputed", "model": "unknown"})
        if len(vectors) != len(items):
            raise ValueError(
                f"{len(vectors)} vectors for {len(items)} catalogue items (one row per item, in order)"
            )
        dropped, encode_seconds = 0, 0.0
    counts = catalogue.item_counts()
    item_vectors = item_vectors or ItemVectorsConfig()
    vector_map, vector_stats = None, {}
    if item_vectors.uses_behaviour:  # the training histories only: no validation or test target
        vectors, vector_map, vector_stats = build_item_vectors(
            behaviour_split(catalogue, item_vectors),
            [it.item_id for it in items],
            vectors,
            item_vectors,
            seed,
            show_progress=show_progress,
        )
    index = index_from_vectors(
        vectors,
        [it.item_id for it in items],
        config,
        dedup=dedup,
        encoder=fingerprint,
        text_template=template.spec(),
        item_interactions=np.array([counts[it.item_id] for it in items], dtype=np.int64),
        item_categories=[it.categories for it in items],
        token_template=token_template,
        build_config={
            "catalogue": catalogue.name,
            CATALOGUE_RECORD: read_from.to_dict(),
            "catalogue_report": catalogue.report.summary(),
            "k_core": k_core,
            "n_users": len(catalogue.sequences),
            "n_interactions": catalogue.n_interactions,
            "dropped_empty_text": dropped,
            **({"item_vectors": asdict(item_vectors)} if item_vectors.uses_behaviour else {}),
        },
        quantizer=quantizer,
        rqvae_config=RQVAEConfig(
            codes_per_level=config.codes_per_level, epochs=rqvae_epochs, seed=seed, device=device
        )
        if quantizer == "rqvae"
        else None,
    )
    index.quality["encode_seconds"] = round(encode_seconds, 3)
    index.quality.update(vector_stats)
    index.vector_map = vector_map
    if output is not None:
        index.save(output)
    return index


# Items -> text -> vectors, the one encode step of ``build_sids`` (a new index) and ``add_items`` (new items
# of an index): render each item under a template, refuse or drop those whose text is empty, load the encoder,
# let the caller check it (and the kept items) before the slow part, encode through the cache.


@dataclass
class EncodedItems:
    """What :func:`encode_items` gives: the items kept (in order), one vector row each, the encoder that
    made them, the ids dropped for empty text, and the seconds the encoding took."""

    items: list[Item]
    vectors: np.ndarray
    encoder: TextEncoder
    dropped: list[str] = field(default_factory=list)
    seconds: float = 0.0


def encode_items(
    items: Sequence[Item],
    template: TextTemplate,
    encoder: TextEncoder | str | None = None,
    *,
    empty_text: str = "error",
    what: str = "items",
    fields_of: str = "the template",
    fix: str = "give them text",
    before_encoding: Callable[[list[Item], TextEncoder], Any] | None = None,
    device: str = "cpu",
    batch_size: int = 64,
    cache_dir: str | Path | None = None,
    use_cache: bool = True,
    show_progress: bool = True,
) -> EncodedItems:
    """Encode ``items`` rendered by ``template`` with ``encoder`` (a TextEncoder or a ``load_encoder`` spec).

    Items whose text is empty: a :class:`CatalogueError` naming ``what``, ``fields_of`` and ``fix`` (``empty_text="error"``),
    or left out (``"drop"``; :attr:`EncodedItems.dropped` lists them; none left is an error).
    ``before_encoding(kept_items, encoder)`` runs after the encoder loads and before anything is encoded,
    so a caller's checks (the index's encoder, enough items for the codes) stop before the slow part."""
    if empty_text not in ("error", "drop"):
        raise ValueError(f"empty_text must be 'error' or 'drop', got {empty_text!r}")
    kept, texts = list(items), template.render_all(items)
    empty = [it.item_id for it, text in zip(kept, texts, strict=True) if not text]
    if empty and empty_text == "error":
        raise CatalogueError(
            f"{len(empty)} {what} have no text in {fields_of} fields {list(template.fields)} "
            f"(e.g. {empty[:5]}); {fix}, or pass empty_text='drop' (--drop-empty-text) to leave them out"
        )
    if empty:
        kept = [it for it, text in zip(kept, texts, strict=True) if text]
        texts = [text for text in texts if text]
        logger.warning("dropped %d %s whose text under fields %s is empty", len(empty), what, template.fields)
        if not kept:
            raise CatalogueError(
                f"none of the {len(empty)} {what} has text in {fields_of} fields {list(template.fields)}; {fix}"
            )
    enc = load_encoder(encoder, device)
    if before_encoding is not None:
        before_encoding(kept, enc)
    start = time.perf_counter()
    vectors = encode_texts(
        texts,
        enc,
        batch_size=batch_size,
        cache_dir=cache_dir,
        use_cache=use_cache,
        show_progress=show_progress,
    )
    return EncodedItems(kept, vectors, enc, empty, time.perf_counter() - start)
