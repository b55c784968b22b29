"""New items in a trained SID index: code them with the frozen codebooks, never touch an existing SID.

:func:`add_items` encodes new items with the encoder and text template the index records, quantises
them with its codebooks, and resolves collisions the way the index was built:

* ``dedup="level"`` (the default build): a new item joining a SID group gets the group's next free
  disambiguation code (new items of one group in order of increasing final residual, ties by input
  order). When a group outgrows the level, the level grows: its new tokens are appended, so the child's
  token list extends the parent's in order and every parent token keeps its row.
* ``dedup="reassign"``: the new items of a prefix group take the nearest last-level codes still free in
  it (Hungarian); a group with no free code left keeps its nearest code and is counted as unresolved.
* ``dedup="none"``: the nearest codes, collisions counted.

The result is a new :class:`SIDIndex`: existing items' codes bit for bit, ``parent`` the parent's
fingerprint, ``lineage`` every ancestor's. Centroids stay exact means of the items under each token
(running means: a token's row moves only if new items carry it); k-means codebooks are unchanged.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from .._io import locks_output
from ..sids.catalogue import Catalogue, CatalogueError, Item
from ..sids.collisions import collision_stats, group_ids
from ..sids.index import JSON_NAME, SIDIndex

logger = logging.getLogger(__name__)


class GrowthError(ValueError):
    """New items that cannot be added as given (already indexed, duplicated, without text)."""


@dataclass
class GrowthReport:
    """What :func:`add_items` did: items added and left out (with why), tokens added, collisions."""

    added: list[str] = field(default_factory=list)
    already_indexed: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    empty_text: list[str] = field(default_factory=list)
    new_tokens: list[str] = field(default_factory=list)
    shared_sid_groups: int = 0  # new items that joined an existing SID group (got a disambiguation code)
    unresolved_collisions: int = 0
    encode_seconds: float = 0.0
    code_seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "n_added": len(self.added),
            "already_indexed": self.already_indexed,
            "duplicates": self.duplicates,
            "empty_text": self.empty_text,
            "new_tokens": self.new_tokens,
            "joined_existing_sid": self.shared_sid_groups,
            "unresolved_collisions": self.unresolved_collisions,
            "encode_seconds": round(self.encode_seconds, 3),
            "code_seconds": round(self.code_seconds, 3),
        }

    def summary(self) -> str:
        skipped = [
            f"{len(v)} {k}"
            for k, v in (
                ("already in the index", self.already_indexed),
                ("duplicated in the batch", self.duplicates),
                ("with empty text", self.empty_text),
            )
            if v
        ]
        return (
            f"added {len(self.added)} items, {len(self.new_tokens)} new tokens "
            f"({', '.join(self.new_tokens[:6])}{' ...' if len(self.new_tokens) > 6 else ''})"
            + (f"; left out: {', '.join(skipped)}" if skipped else "")
            + (
                f"; {self.unresolved_collisions} items still share a SID"
                if self.unresolved_collisions
                else ""
            )
        )


def _checked_batch(
    index: SIDIndex, item_ids: Sequence[str], on_problem: str, report: GrowthReport
) -> np.ndarray:
    """Boolean mask of the rows to add; raises (``on_problem="error"``) or records what is left out."""
    ids = [str(i) for i in item_ids]
    counts = Counter(ids)
    duplicated = sorted(i for i, n in counts.items() if n > 1)
    present = sorted({i for i in ids if i in index})
    if on_problem == "error" and (duplicated or present):
        parts = []
        if present:
            parts.append(f"{len(present)} items are already in the index (e.g. {present[:5]})")
        if duplicated:
            parts.append(
                f"{len(duplicated)} item ids appear more than once in the batch (e.g. {duplicated[:5]})"
            )
        raise GrowthError(
            "; ".join(parts)
            + ". An item's SID never changes once given: remove them from the batch, or pass "
            "on_problem='skip' (--skip-problems) to add the rest and report them."
        )
    keep = np.ones(len(ids), dtype=bool)
    seen: set[str] = set()
    for row, item in enumerate(ids):
        if item in index:
            keep[row] = False
        elif item in seen:
            keep[row] = False  # the first occurrence is added
        seen.add(item)
    report.already_indexed = present
    report.duplicates = sorted(set(report.duplicates) | set(duplicated))
    return keep


def _loader_drops(catalogue: Catalogue, on_problem: str, empty_text: str, report: GrowthReport) -> None:
    """Refuse (or, with ``skip`` / ``drop``, report) what the catalogue's loader left out: repeated ids
    (it kept the first record) and items with no text at all. A file gets the checks a list of items gets."""
    source = catalogue.report.source or catalogue.name
    repeated = sorted(set(catalogue.report.duplicate_item_ids))
    conflicting = sorted(set(catalogue.report.conflicting_item_ids))
    no_text = list(catalogue.report.no_text_item_ids)
    if repeated and on_problem == "error":
        differing = (
            f", {len(conflicting)} of them with different records (e.g. {conflicting[:5]})"
            if conflicting
            else ""
        )
        raise GrowthError(
            f"{len(repeated)} item ids appear more than once in {source} (e.g. {repeated[:5]}){differing}. An "
            "item's SID never changes once given: keep one record per id, or pass on_problem='skip' "
            "(--skip-problems) to add the first record of each and report them."
        )
    if no_text and empty_text == "error":
        raise CatalogueError(
            f"{len(no_text)} new items in {source} have no text in any field (e.g. {no_text[:5]}); give them "
            "text, or pass empty_text='drop' (--drop-empty-text) to leave them out"
        )
    report.duplicates = sorted(set(report.duplicates) | set(repeated))
    report.empty_text = [*report.empty_text, *no_text]


def add_vectors(
    index: SIDIndex,
    item_ids: Sequence[str],
    vectors: np.ndarray,
    *,
    encoder: Any = None,
    item_interactions: Sequence[int] | None = None,
    item_categories: Sequence[tuple[str, ...]] | None = None,
    on_problem: str = "error",
    report: GrowthReport | None = None,
) -> SIDIndex:
    """The core of :func:`add_items` for ready vectors (one row per id, from the index's encoder).

    ``encoder``: a TextEncoder or its fingerprint, checked against the index's (pass it whenever the
    vectors come from an encoder). ``on_problem``: ``"error"`` (default) or ``"skip"`` for ids already
    in the index or repeated in the batch; ``report`` (a :class:`GrowthReport`) receives what happened.
    """
    if on_problem not in ("error", "skip"):
        raise ValueError(f"on_problem must be 'error' or 'skip', got {on_problem!r}")
    report = report if report is not None else GrowthReport()
    start = time.perf_counter()
    x = np.asarray(vectors, dtype=np.float32)
    if x.ndim != 2 or len(x) != len(item_ids):
        raise ValueError(f"{x.shape} vectors for {len(item_ids)} item ids (one row per id, in order)")
    keep = _checked_batch(index, item_ids, on_problem, report)
    ids = [str(i) for i, k in zip(item_ids, keep, strict=True) if k]
    x = x[keep]
    if not ids:
        raise GrowthError("no new items to add (every item of the batch was left out: see the report)")
    if not np.isfinite(x).all():
        raise GrowthError("the new items' vectors contain NaN or Inf; re-encode them")
    from ..sids.quantizers import quantize

    if encoder is not None:
        index.check_encoder(encoder)
    x = index.index_vectors(x)  # a behaviour or mixed index: the text-to-behaviour map
    index.quantize(x[:1])  # the index's checks: width, quantizer (one row)
    codes_t, residual_t = quantize(x, index.codebooks, index.normalize_residuals)
    k_codes, residual = codes_t.numpy(), residual_t.numpy()
    mode = dedup_mode(index)
    per_level = list(index.codes_per_level)
    if mode == "level":
        extra = next_disambiguation(index.codes, k_codes, (residual**2).sum(1))
        new_codes = np.concatenate([k_codes, extra[:, None]], axis=1)
        per_level[-1] = max(per_level[-1], int(extra.max()) + 1)
        report.shared_sid_groups = int((extra > 0).sum())
    elif mode == "reassign":
        last_book = np.asarray(index.codebooks[-1], dtype=np.float32)
        entering = residual + last_book[k_codes[:, -1]]
        new_codes, report.unresolved_collisions = reassign_new(index.codes, k_codes, entering, last_book)
        residual = entering - last_book[new_codes[:, -1]]
    else:
        new_codes = k_codes
    codes = np.concatenate([index.codes, new_codes]).astype(np.int64)
    if mode == "none":
        report.unresolved_collisions = collision_stats(codes).colliding_items - int(
            index.quality.get("collisions_after", {}).get("colliding_items", 0)
        )
    if report.unresolved_collisions:
        logger.warning("%d new items share a SID with another item", report.unresolved_collisions)
    parent_tokens = index.token_strings
    child_counts = tuple(per_level)
    centroids = grown_centroids(index, new_codes, x, residual, child_counts)
    interactions = None
    if index.item_interactions is not None:
        added = np.zeros(len(ids), dtype=np.int64)
        if item_interactions is not None:
            added = np.asarray(item_interactions, dtype=np.int64)[keep]
        interactions = np.concatenate([index.item_interactions, added])
    categories = None
    if index.item_categories is not None:
        new_cats = [()] * len(ids)
        if item_categories is not None:
            new_cats = [tuple(c) for c, k in zip(item_categories, keep, strict=True) if k]
        categories = [*index.item_categories, *new_cats]
    report.added = ids
    report.code_seconds = time.perf_counter() - start
    quality = dict(index.quality)
    quality["n_items"] = len(codes)
    quality["collisions_after"] = collision_stats(codes).as_dict()
    child = SIDIndex(
        item_ids=[*index.item_ids, *ids],
        codes=codes,
        codes_per_level=child_counts,
        codebooks=index.codebooks,
        centroids=centroids,
        disambiguation_level=index.disambiguation_level,
        normalize_residuals=index.normalize_residuals,
        token_template=index.token_template,
        encoder=dict(index.encoder),
        text_template=None if index.text_template is None else dict(index.text_template),
        quality=quality,
        build_config=dict(index.build_config),
        item_interactions=interactions,
        item_categories=categories,
        quantizer=index.quantizer,
        parent=index.fingerprint(),
        lineage=[*index.lineage, index.fingerprint()],
        vector_map=index.vector_map,
    )
    report.new_tokens = child.token_strings[len(parent_tokens) :]
    record = {k: v[:100] if isinstance(v, list) else v for k, v in report.as_dict().items()}  # bounded JSON
    growth = record | {
        "parent": child.parent,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    child.quality["growth"] = [*index.quality.get("growth", []), growth]
    return child


def add_items(
    index: SIDIndex,
    catalogue: Catalogue | Sequence[Item] | str | Path,
    *,
    encoder: Any = None,
    vectors: np.ndarray | None = None,
    on_problem: str = "error",
    empty_text: str = "error",
    batch_size: int = 64,
    cache_dir: str | Path | None = None,
    use_cache: bool = True,
    device: str = "cpu",
    show_progress: bool = True,
    catalogue_format: str = "auto",
    catalogue_options: Mapping[str, Any] | None = None,
    report: GrowthReport | None = None,
) -> SIDIndex:
    """A new version of ``index`` holding the items of ``catalogue`` too (see the module doc).

    ``catalogue``: a :class:`Catalogue`, a list of :class:`Item` (duplicate ids are detected there), or
    a path for :func:`~peft_grounded.sids.loaders.load_catalogue`. Texts use the index's recorded
    template. ``encoder``: a TextEncoder or a ``load_encoder`` spec (default ``"minilm"``); it must be the
    index's encoder (checked by fingerprint). ``vectors`` (one row per item, from that encoder) skip
    encoding. ``on_problem`` / ``empty_text``: ``"error"`` (default) or ``"skip"`` / ``"drop"`` to add the
    rest and list the others in ``report``.
    """
    from .. import checks
    from ..sids.build import encode_items
    from ..sids.catalogue import TextTemplate

    checks.raise_problems(
        "add_items",
        [
            checks.one_of("empty_text", empty_text, ("error", "drop")),
            checks.one_of("on_problem", on_problem, ("error", "skip")),
            checks.int_at_least("batch_size", batch_size, 1, flag="--encode-batch-size"),
        ],
    )
    if vectors is None:
        checks.check_device(device)
    report = report if report is not None else GrowthReport()
    counts: Mapping[str, int] = {}
    read_from = None  # where the new items were read: the grown index records it beside its build catalogue
    if isinstance(catalogue, (str, Path)):
        from ..sids.catalogue_source import CatalogueSource
        from ..sids.loaders import load_catalogue

        path = catalogue
        catalogue = load_catalogue(catalogue, format=catalogue_format, **(catalogue_options or {}))
        read_from = CatalogueSource.of(catalogue, path, catalogue_format, dict(catalogue_options or {}))
    if isinstance(catalogue, Catalogue):
        items = list(catalogue.items.values())
        counts = catalogue.item_counts()
        _loader_drops(catalogue, on_problem, empty_text, report)
    else:
        items = list(catalogue)
    if not items:
        raise GrowthError("the catalogue of new items is empty")
    if vectors is None:
        template = TextTemplate.from_spec(index.text_template) if index.text_template else TextTemplate()
        encoded = encode_items(
            items,
            template,
            encoder,
            empty_text=empty_text,
            what="new items",
            fields_of="the index's template",
            before_encoding=lambda _, enc: index.check_encoder(enc),  # before the (slow) encoding
            device=device,
            batch_size=batch_size,
            cache_dir=cache_dir,
            use_cache=use_cache,
            show_progress=show_progress,
        )
        report.empty_text = [*report.empty_text, *encoded.dropped]
        items, vectors, encoder = encoded.items, encoded.vectors, encoded.encoder
        report.encode_seconds = encoded.seconds
    elif len(vectors) != len(items):
        raise ValueError(f"{len(vectors)} vectors for {len(items)} new items (one row per item, in order)")
    child = add_vectors(
        index,
        [it.item_id for it in items],
        vectors,
        encoder=encoder,
        item_interactions=[counts.get(it.item_id, 0) for it in items],
        item_categories=[it.categories for it in items],
        on_problem=on_problem,
        report=report,
    )
    child.quality["growth"][-1]["encode_seconds"] = round(report.encode_seconds, 3)
    if read_from is not None:
        from ..sids.catalogue_source import ADDED_KEY

        added = [*child.build_config.get(ADDED_KEY, []), read_from.to_dict()]
        child.build_config = child.build_config | {ADDED_KEY: added}
    return child


@locks_output("output", "add-items")
def add_items_to(
    parent: str | Path,
    catalogue: Catalogue | Sequence[Item] | str | Path,
    output: str | Path,
    *,
    overwrite: bool = False,
    **options: Any,
) -> SIDIndex:
    """:func:`add_items` on the index saved in ``parent``, saved as a new version in ``output`` (the
    ``add-items`` command); ``options`` go to :func:`add_items` (``encoder`` defaults to the parent's).

    ``output`` is locked from its check to the save; it must not be ``parent`` (adapters trained on the
    parent need it) nor hold an index already, unless ``overwrite`` (which replaces the index's own files
    only). Everything is checked before the new items are encoded."""
    parent_dir, out = Path(parent).resolve(), Path(output).resolve()
    if parent_dir == out:
        raise GrowthError(
            "--output_dir is the parent index's directory; write the new version elsewhere (the parent stays "
            "loadable for the adapters trained on it)"
        )
    if (out / JSON_NAME).is_file() and not overwrite:
        raise GrowthError(
            f"{out} already holds a SID index; adapters trained on it would no longer match. Choose another "
            "--output_dir, or pass --overwrite to replace it"
        )
    index = SIDIndex.load(parent_dir)
    if options.get("encoder") is None and options.get("vectors") is None:
        options["encoder"] = encoder_spec(index)
    child = add_items(index, catalogue, **options)
    child.save(out)
    return child


def encoder_spec(index: SIDIndex) -> str:
    """The ``load_encoder`` spec of the index's encoder when it is a packaged one, else a clear error."""
    fingerprint = index.encoder or {}
    if (
        fingerprint.get("kind") == "sentence-transformers"
        and "minilm" in str(fingerprint.get("model", "")).lower()
    ):
        return "minilm"
    if fingerprint.get("kind") == "lm" and "smollm2" in str(fingerprint.get("model", "")).lower():
        return "smollm2-emb" if fingerprint.get("pooling") == "mean_embeddings" else "smollm2"
    raise GrowthError(
        f"this index was built with encoder {fingerprint.get('model', 'unknown')!r} ({fingerprint.get('kind')}); "
        "name it with --encoder (the spec build-sids was given, e.g. st:PATH or lm:PATH)"
    )


# How new items get their codes in a grown index, and the grown centroids: the disambiguation level's next
# free codes, a Hungarian reassignment of the last level, or the nearest codes; running means per token.


def dedup_mode(index: SIDIndex) -> str:
    if index.disambiguation_level:
        return "level"
    return str(index.build_config.get("dedup") or index.quality.get("dedup") or "none")


def next_disambiguation(
    parent_codes: np.ndarray, new_prefix: np.ndarray, residual_sq: np.ndarray
) -> np.ndarray:
    """Disambiguation codes for the new items: each group's next free codes, best-fitting first."""
    n_old = len(parent_codes)
    prefixes = np.concatenate([parent_codes[:, :-1], new_prefix])
    group, _ = group_ids(prefixes)
    used = np.full(group.max() + 1, -1, dtype=np.int64)
    np.maximum.at(used, group[:n_old], parent_codes[:, -1])
    new_group = group[n_old:]
    order = np.lexsort((np.arange(len(new_group)), residual_sq, new_group))
    out = np.empty(len(new_group), dtype=np.int64)
    sorted_groups = new_group[order]
    starts = np.searchsorted(sorted_groups, sorted_groups, "left")
    out[order] = used[sorted_groups] + 1 + (np.arange(len(order)) - starts)
    return out


def reassign_new(
    parent_codes: np.ndarray, new_codes: np.ndarray, entering: np.ndarray, last_book: np.ndarray
) -> tuple[np.ndarray, int]:
    """Last-level codes for new items: the nearest codes still free within their prefix group."""
    from .._imports import require

    linear_sum_assignment = require("scipy.optimize", "codes for new items (add-items)").linear_sum_assignment

    codes = new_codes.copy()
    k = last_book.shape[0]
    taken: dict[tuple[int, ...], set[int]] = {}
    for row in parent_codes.tolist():
        taken.setdefault(tuple(row[:-1]), set()).add(row[-1])
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, row in enumerate(codes.tolist()):
        groups.setdefault(tuple(row[:-1]), []).append(i)
    cost = (entering**2).sum(1)[:, None] - 2 * entering @ last_book.T + (last_book**2).sum(1)[None, :]
    unresolved = 0
    for prefix, rows in groups.items():
        free = np.array(sorted(set(range(k)) - taken.get(prefix, set())), dtype=np.int64)
        rows_a = np.asarray(rows)
        if len(free) == 0:
            codes[rows_a, -1] = cost[rows_a].argmin(1)
            unresolved += len(rows)
            continue
        sub = cost[np.ix_(rows_a, free)]
        r, c = linear_sum_assignment(sub)
        codes[rows_a[r], -1] = free[c]
        rest = np.setdiff1d(np.arange(len(rows)), r)
        if len(rest):
            codes[rows_a[rest], -1] = cost[rows_a[rest]].argmin(1)
            unresolved += len(rest)
    return codes, unresolved


def _running_means(
    old: np.ndarray, old_counts: np.ndarray, values: np.ndarray, labels: np.ndarray, n_rows: int
) -> np.ndarray:
    """Rows ``old`` (means over ``old_counts`` items, padded to ``n_rows``) updated with ``values`` by label."""
    sums = np.zeros((n_rows, values.shape[1]), dtype=np.float64)
    np.add.at(sums, labels, values.astype(np.float64))
    counts = np.bincount(labels, minlength=n_rows).astype(np.float64)
    before = np.zeros(n_rows, dtype=np.float64)
    before[: len(old_counts)] = old_counts
    out = np.zeros((n_rows, old.shape[1]), dtype=np.float64)
    out[: len(old)] = old
    touched = counts > 0
    total = before[touched] + counts[touched]
    out[touched] = (out[touched] * before[touched, None] + sums[touched]) / total[:, None]
    return out


def grown_centroids(
    index: SIDIndex, codes: np.ndarray, vectors: np.ndarray, residual: np.ndarray, per_level: Sequence[int]
) -> dict[str, np.ndarray]:
    """The centroid variants of the child, rows in the child's token order."""
    out: dict[str, np.ndarray] = {}
    old_offsets = np.cumsum((0, *index.codes_per_level[:-1]))
    n_books = len(index.codebooks)
    for variant, matrix in index.centroids.items():
        rows = []
        for level, k in enumerate(per_level):
            old = matrix[old_offsets[level] : old_offsets[level] + index.codes_per_level[level]]
            if variant == "codebook" and level < n_books:
                rows.append(old.astype(np.float64))  # a k-means codebook: unchanged
                continue
            values = residual if variant == "codebook" else vectors
            counts = np.bincount(index.codes[:, level], minlength=index.codes_per_level[level])
            rows.append(_running_means(old, counts, values, codes[:, level], k))
        out[variant] = np.concatenate(rows).astype(np.float32)
    return out
