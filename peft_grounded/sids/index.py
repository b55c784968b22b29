"""The SID index: the artefact that the SID stage hands to every later stage.

It holds item -> SID codes, the codebooks of each k-means level, the per-token centroids in two variants,
the quality figures, and the provenance (encoder fingerprint, text template, build settings, format
version). Token rows always follow :func:`~peft_grounded.sids.tokens.sid_vocabulary` order: level by
level, code by code (``<a_0> ... <a_255> <b_0> ...``), the disambiguation level last when there is one.

Centroid variants (one row per SID token, in the encoder's space, dimension ``dim``):

* ``"items"`` (default): the mean of the *original* embeddings of all items that carry the code at that
  level. Every token lives in the same space as the item vectors, so tokens of all levels are comparable
  and a level-2 token is "the region of its items", not a small residual vector near the origin.
* ``"codebook"``: the level's codebook vector in residual space (level 0 coincides with the item space;
  deeper levels are residuals, small and centred near 0). For an RQ-VAE index this is its latent space,
  of another width than the items.

For a disambiguation level both variants use item statistics: ``"items"`` the mean original embedding of
the items holding that code, ``"codebook"`` the mean of their final residuals (what a codebook vector at
that level would be). A code that no item carries (an unused k-means code) gets the mean of all items in
the ``"items"`` variant.

Files: ``<dir>/sid_index.json`` (metadata, item ids, name, SHA-256 and size of the tensor file) and
``<dir>/sid_index.<hash>.safetensors`` (codes, codebooks, centroids, item interaction counts), named by
its content. The tensor file is written first, under its new name, then the JSON replaces the old one
(both through temporary files and ``os.replace``), then stale tensor files go: a crash at any point
leaves a loadable index. The checksum detects a truncated or corrupted tensor file.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._io import atomic_write, read_json
from .tensor_files import FORMAT, remove_unnamed_tensor_files
from .tokens import DEFAULT_TEMPLATE, parse_sid, sid_string, sid_vocabulary

FORMAT_VERSION = 1
JSON_NAME = "sid_index.json"
TENSORS_NAME = "sid_index.safetensors"  # the name older saves used (still read: the JSON names the file)


TENSOR_FILE_PATTERN = re.compile(r"sid_index(\.[0-9a-f]{16})?\.safetensors")


def tensor_file_name(sha256: str) -> str:
    """The tensor file's name: content-addressed, so a new save never overwrites the one in use."""
    return f"sid_index.{sha256[:16]}.safetensors"


def tensors_path(directory: str | Path) -> Path:
    """The tensor file the index saved in ``directory`` uses (named in its ``sid_index.json``)."""
    directory = Path(directory)
    meta = read_json(directory / JSON_NAME, fix=REBUILD)
    record = meta.get("tensors") if isinstance(meta, dict) else None
    name = record.get("file") if isinstance(record, dict) else None
    if not isinstance(name, str) or not TENSOR_FILE_PATTERN.fullmatch(name):
        raise IndexFileError(
            f"{directory / JSON_NAME} names the tensor file {name!r}, not a content-named file"
        )
    return directory / name


REBUILD = "rebuild it with `peft-grounded build-sids` (or restore a good copy)"

# sid_index.json fields: (type(s), required); older saves lack the optional ones
_META_FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {
    "version": ((int,), True),
    "item_ids": ((list,), True),
    "codes_per_level": ((list,), True),
    "disambiguation_level": ((bool,), True),
    "normalize_residuals": ((bool,), True),
    "token_template": ((str,), True),
    "centroid_variants": ((list,), True),
    "encoder": ((dict,), True),
    "text_template": ((dict, type(None)), True),
    "quality": ((dict,), True),
    "build_config": ((dict,), True),
    "quantizer": ((str,), False),
    "item_categories": ((list, type(None)), False),
    "parent": ((str, type(None)), False),
    "lineage": ((list, type(None)), False),
}


def _check_meta(meta: dict[str, Any], json_path: Path) -> None:
    """Raise :class:`IndexFileError` naming every field of ``sid_index.json`` that is missing or of the
    wrong type (a hand-edited or foreign file would otherwise fail deep inside the loader)."""
    problems = []
    for key, (types, required) in _META_FIELDS.items():
        if key not in meta:
            if required:
                problems.append(f"{key!r} is missing")
            continue
        value = meta[key]
        wrong_bool = isinstance(value, bool) and bool not in types  # JSON true is not a version number
        if not isinstance(value, types) or wrong_bool:
            wanted = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            problems.append(f"{key!r} must be {wanted}, got {value!r:.60}")
    if not problems:
        if not all(isinstance(i, str) for i in meta["item_ids"]):
            problems.append("'item_ids' must be a list of strings")
        if not all(
            isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in meta["codes_per_level"]
        ):
            problems.append(
                f"'codes_per_level' must be positive integers, got {meta['codes_per_level']!r:.60}"
            )
        unknown = [v for v in meta["centroid_variants"] if v not in CENTROID_VARIANTS]
        if unknown:
            problems.append(f"'centroid_variants' holds unknown variants {unknown!r:.60}")
        if meta.get("quantizer", "rqkmeans") not in ("rqkmeans", "rqvae"):
            problems.append(f"'quantizer' must be 'rqkmeans' or 'rqvae', got {meta['quantizer']!r:.60}")
    if problems:
        raise IndexFileError(
            f"{json_path}: " + "; ".join(problems) + f" (a damaged or foreign index); {REBUILD}"
        )


def _hub_cache_blobs(directory: Path) -> Path | None:
    """The ``blobs`` folder of the Hugging Face cache repo ``directory`` is a snapshot folder of, if it is one
    (the cache links ``snapshots/<commit>/...`` files to ``blobs/<hash>``)."""
    for parent in directory.resolve().parents:
        if parent.name == "snapshots":
            blobs = parent.parent / "blobs"
            return blobs.resolve() if blobs.is_dir() else None
    return None


def _own_file(path: Path, directory: Path) -> Path:
    """``path`` if it is a file of ``directory`` itself, not a link out of it (an index reads only its own
    files: a link could make it read, and checksum-accept, any file on the machine); the Hugging Face
    cache's links from a snapshot to its repo's blobs are its own files."""
    resolved = path.resolve()
    if resolved.parent not in (directory.resolve(), _hub_cache_blobs(directory)):
        raise IndexFileError(
            f"{path} is a link to {resolved}, outside the index folder {directory}; an index reads only its own "
            f"files: copy the file into the folder (replacing the link), or {REBUILD}"
        )
    return path


CENTROID_VARIANTS = ("items", "codebook")


class IndexFileError(ValueError):
    """A SID index file that is missing, truncated, corrupted or of an unknown version."""


class EncoderMismatchError(ValueError):
    """Vectors from another encoder than the one the index was built with."""


def _package_version() -> str:
    try:
        from importlib.metadata import version

        return version("peft-grounded")
    except Exception:  # pragma: no cover - not installed
        return "unknown"


@dataclass(eq=False)
class SIDIndex:
    """Item -> SID codes with codebooks, per-token centroids, quality figures and provenance."""

    item_ids: list[str]
    codes: np.ndarray  # [n_items, n_levels] int64
    codes_per_level: tuple[int, ...]  # vocabulary size of each level (disambiguation level included)
    codebooks: list[np.ndarray]  # one [K_l, dim] array per k-means level
    centroids: dict[str, np.ndarray]  # variant -> [n_tokens, dim]
    disambiguation_level: bool = False
    normalize_residuals: bool = False
    token_template: str = DEFAULT_TEMPLATE
    encoder: dict[str, Any] = field(default_factory=dict)
    text_template: dict[str, Any] | None = None
    quality: dict[str, Any] = field(default_factory=dict)
    build_config: dict[str, Any] = field(default_factory=dict)
    item_interactions: np.ndarray | None = None  # [n_items] interactions per item in the build catalogue
    item_categories: list[tuple[str, ...]] | None = None  # category path per item
    quantizer: str = "rqkmeans"  # or "rqvae" (codebooks and the "codebook" centroids in its latent space)
    version: int = FORMAT_VERSION
    parent: str | None = None  # fingerprint of the index this one grew from (add_items), None for a build
    lineage: list[str] = field(default_factory=list)  # fingerprints of every ancestor, oldest first

    def __post_init__(self) -> None:
        self.codes = np.asarray(self.codes, dtype=np.int64)
        self.codes_per_level = tuple(int(k) for k in self.codes_per_level)
        n, levels = self.codes.shape if self.codes.ndim == 2 else (-1, -1)
        if n != len(self.item_ids) or levels != len(self.codes_per_level):
            raise IndexFileError(
                f"codes have shape {self.codes.shape}, expected ({len(self.item_ids)}, {len(self.codes_per_level)})"
            )
        if len(set(self.item_ids)) != n:
            raise IndexFileError("item ids in a SID index must be unique")
        if n and ((self.codes < 0).any() or (self.codes >= np.asarray(self.codes_per_level)).any()):
            raise IndexFileError(f"codes out of range for codes_per_level={self.codes_per_level}")
        if len(self.codebooks) != levels - int(self.disambiguation_level):
            raise IndexFileError(f"{len(self.codebooks)} codebooks for {levels} levels")
        for variant, matrix in self.centroids.items():
            if matrix.ndim != 2 or matrix.shape[0] != self.n_tokens:
                raise IndexFileError(
                    f"centroids[{variant!r}] has shape {matrix.shape}, expected {self.n_tokens} rows (one per token)"
                )
        self._row: dict[str, int] | None = None
        self._by_sid: dict[tuple[int, ...], str] | None = None
        self._sorted: tuple[np.ndarray, np.ndarray] | None = None

    # ------------------------------------------------------------------------------------------ shape

    @property
    def n_items(self) -> int:
        return len(self.item_ids)

    @property
    def n_levels(self) -> int:
        return len(self.codes_per_level)

    @property
    def n_tokens(self) -> int:
        return int(sum(self.codes_per_level))

    @property
    def dim(self) -> int:
        """Width of the item vectors (and of the ``items`` centroids)."""
        if "items" in self.centroids:
            return int(self.centroids["items"].shape[1])
        return int(self.codebooks[0].shape[1])

    @property
    def token_strings(self) -> list[str]:
        """Every SID token, in row order (level by level, code by code)."""
        return sid_vocabulary(self.codes_per_level, self.token_template)

    def token_offset(self, level: int) -> int:
        """Row of ``(level, code 0)`` in the token order."""
        return int(sum(self.codes_per_level[:level]))

    # ------------------------------------------------------------------------------------------ hand-over

    def adapter_init(self, variant: str = "items") -> tuple[list[str], Any]:
        """``(token_strings, vectors)``: the SID tokens and a float32 ``torch.Tensor [n_tokens, dim]`` whose
        rows follow ``token_strings`` — ready for ``GroundedTokenConfig(init="centroid", init_vectors=...)``."""
        import torch

        if variant not in self.centroids:
            raise ValueError(f"unknown centroid variant {variant!r}; use one of {sorted(self.centroids)}")
        return self.token_strings, torch.tensor(self.centroids[variant], dtype=torch.float32)

    # ------------------------------------------------------------------------------------------ lookups

    def _rows(self) -> dict[str, int]:
        if self._row is None:
            self._row = {item: i for i, item in enumerate(self.item_ids)}
        return self._row

    def __contains__(self, item_id: object) -> bool:
        return str(item_id) in self._rows()

    def row_of(self, item_id: str) -> int:
        try:
            return self._rows()[str(item_id)]
        except KeyError:
            raise KeyError(f"item {item_id!r} is not in the SID index ({self.n_items} items)") from None

    def sid_of(self, item_id: str) -> tuple[int, ...]:
        """The codes of an item, e.g. ``(12, 3, 200, 0)``."""
        return tuple(int(c) for c in self.codes[self.row_of(item_id)])

    def sid_text(self, item_id: str) -> str:
        """The SID string of an item, e.g. ``"<a_12><b_3><c_200><d_0>"``."""
        return sid_string(self.sid_of(item_id), self.token_template)

    def fingerprint(self) -> str:
        """Short sha256 of what makes a SID token mean something: item ids, their codes, levels, template.

        Two indices with the same token strings but other item -> SID assignments (another seed, encoder
        or catalogue) get different fingerprints; adapters record it (``sid_index_fingerprint``).
        """
        digest = hashlib.sha256()
        digest.update(json.dumps([self.item_ids, list(self.codes_per_level), self.token_template]).encode())
        digest.update(np.ascontiguousarray(self.codes, dtype=np.int64).tobytes())
        return digest.hexdigest()[:16]

    def check_adapter(self, config: Any, where: str = "the adapter") -> None:
        """Raise unless the adapter ``config`` was made for this index's tokens (and, when recorded, codes);
        ``where`` names the adapter in the message. An adapter of an index this one grew from is told to
        grow first."""
        recorded = getattr(config, "sid_index_fingerprint", None)
        grow = (
            f"{where} was trained with an earlier version of this SID index (fingerprint {recorded}); this "
            "version added items. Grow the adapter first: peft-grounded grow-adapter --adapter ADAPTER "
            "--parent-index PARENT_INDEX --sid-index THIS_INDEX --output GROWN (in Python: "
            "peft_grounded.adapter.grow_adapter(model, tokenizer, parent_index, this_index))."
        )
        older = recorded is not None and recorded in self.lineage
        strings = getattr(config, "token_strings", None)
        if strings is not None and list(strings) != self.token_strings:
            raise ValueError(
                f"{where} has {len(strings)} tokens that are not this SID index's {self.n_tokens} tokens (in "
                "order): "
                + (grow[0].lower() + grow[1:] if older else "use the index the adapter was trained with.")
            )
        if older:
            raise ValueError(grow)
        if recorded is not None and recorded != self.fingerprint():
            raise ValueError(
                f"{where} was trained with another SID index (fingerprint {recorded}, this one is "
                f"{self.fingerprint()}): its tokens carry other items' codes. Use the index it was trained with."
            )

    def sid_texts(self) -> list[str]:
        """SID strings of all items, in ``item_ids`` order."""
        return [sid_string(row, self.token_template) for row in self.codes.tolist()]

    def sid_map(self) -> dict[str, str]:
        """``{item_id: SID string}`` for every item (e.g. for ``peft_grounded.decoding``)."""
        return dict(zip(self.item_ids, self.sid_texts(), strict=True))

    def item_of(self, sid: str | Sequence[int]) -> str | None:
        """The item carrying a full SID (codes or string), or ``None``; with collisions, the first item."""
        if self._by_sid is None:
            self._by_sid = {}
            for item, row in zip(self.item_ids, self.codes.tolist(), strict=True):
                self._by_sid.setdefault(tuple(row), item)
        key = tuple(parse_sid(sid, self.token_template)) if isinstance(sid, str) else tuple(sid)
        return self._by_sid.get(key)

    def items_with_prefix(self, prefix: str | Sequence[int]) -> list[str]:
        """Items whose SID starts with ``prefix`` (codes or string), in index order of their SIDs."""
        codes = parse_sid(prefix, self.token_template) if isinstance(prefix, str) else list(prefix)
        if len(codes) > self.n_levels:
            raise ValueError(f"prefix {codes} is longer than the {self.n_levels} levels")
        if self._sorted is None:
            order = np.lexsort(self.codes.T[::-1])
            self._sorted = (order, self.codes[order])
        order, sorted_codes = self._sorted
        lo, hi = 0, len(order)
        for level, code in enumerate(codes):
            column = sorted_codes[lo:hi, level]
            lo, hi = (
                lo + int(np.searchsorted(column, code, "left")),
                lo + int(np.searchsorted(column, code, "right")),
            )
        return [self.item_ids[i] for i in order[lo:hi]]

    def added_items(self, since: str | None = None) -> list[str]:
        """Items that growth (:meth:`add_items`) appended: by the last growth, or by every growth after the
        ancestor whose fingerprint is ``since`` (one of :attr:`lineage`). ``[]`` for a fresh build."""
        growth = self.quality.get("growth", [])
        if since is None:
            records = growth[-1:]
        elif since not in self.lineage:
            raise ValueError(
                f"{since!r} is not an ancestor of this index (its lineage: {self.lineage or 'none, a fresh build'})"
            )
        else:
            records = growth[self.lineage.index(since) - len(self.lineage) :]  # one record per generation
        n_added = sum(int(r.get("n_added", 0)) for r in records)
        return list(self.item_ids[self.n_items - n_added :]) if n_added else []

    # ------------------------------------------------------------------------------------------ statistics

    def token_frequencies(self, by: str = "items", counts: Mapping[str, int] | None = None) -> np.ndarray:
        """Per SID token (row order): how many items carry it (``by="items"``), or how many interactions
        name an item carrying it (``by="interactions"``; ``counts`` maps item id -> count, e.g.
        ``split.training_target_counts()``, and defaults to the build catalogue's interactions)."""
        if by == "items":
            weights = np.ones(self.n_items)
        elif by == "interactions":
            if counts is not None:
                weights = np.array([counts.get(i, 0) for i in self.item_ids], dtype=np.float64)
            elif self.item_interactions is not None:
                weights = self.item_interactions.astype(np.float64)
            else:
                raise ValueError("this index has no interaction counts; pass counts={item_id: count}")
        else:
            raise ValueError(f"by must be 'items' or 'interactions', got {by!r}")
        out = np.concatenate(
            [
                np.bincount(self.codes[:, lv], weights=weights, minlength=k)
                for lv, k in enumerate(self.codes_per_level)
            ]
        )
        return out.astype(np.int64)

    def majority_labels(
        self,
        level: int = 0,
        item_labels: Mapping[str, str] | Sequence[str] | None = None,
        depth: int = 0,
    ) -> list[tuple[str | None, float]]:
        """For each code of ``level``: the most common label of its items and that label's share.

        ``item_labels`` (per item id, or in ``item_ids`` order) defaults to the category path element at
        ``depth`` stored at build time. Codes no item carries give ``(None, 0.0)``.
        """
        if item_labels is None:
            if self.item_categories is None:
                raise ValueError("this index stores no categories; pass item_labels")
            labels = [c[min(depth, len(c) - 1)] if c else "<none>" for c in self.item_categories]
        elif isinstance(item_labels, Mapping):
            labels = [item_labels.get(i, "<none>") for i in self.item_ids]
        else:
            labels = list(item_labels)
        per_code: list[Counter[str]] = [Counter() for _ in range(self.codes_per_level[level])]
        for code, label in zip(self.codes[:, level].tolist(), labels, strict=True):
            per_code[code][label] += 1
        out: list[tuple[str | None, float]] = []
        for counter in per_code:
            if counter:
                label, n = counter.most_common(1)[0]
                out.append((label, n / sum(counter.values())))
            else:
                out.append((None, 0.0))
        return out

    def level0_labels(self, depth: int = 0) -> list[str | None]:
        """Majority category label of each level-0 token (for neighbourhood-purity diagnostics)."""
        return [label for label, _ in self.majority_labels(0, depth=depth)]

    def token_descriptions(self, titles: Any, per_token: int = 3, separator: str = "; ") -> list[str]:
        """One text per SID token (row order): the titles of its ``per_token`` most popular items, for the
        adapter's ``init="description"`` (``init_texts``). ``titles``: a ``Catalogue`` or ``{item_id:
        title}``. Popularity is the build catalogue's interaction count (ties: index order); a token no
        item carries gets ``""``."""
        if hasattr(titles, "items") and not isinstance(titles, Mapping):
            titles = {i: item.title for i, item in titles.items.items()}
        popularity = self.item_interactions if self.item_interactions is not None else np.zeros(self.n_items)
        out: list[str] = []
        for level, k in enumerate(self.codes_per_level):
            order = np.lexsort((np.arange(self.n_items), -popularity, self.codes[:, level]))
            column = self.codes[order, level]
            starts = np.searchsorted(column, np.arange(k), "left")
            ends = np.searchsorted(column, np.arange(k), "right")
            for lo, hi in zip(starts, ends, strict=True):
                names = [titles.get(self.item_ids[i], "") for i in order[lo : min(hi, lo + per_token)]]
                out.append(separator.join(n for n in names if n))
        return out

    # ------------------------------------------------------------------------------------------ new items

    def check_encoder(self, encoder: Any) -> None:
        """Raise :class:`EncoderMismatchError` unless ``encoder`` (a TextEncoder or fingerprint) is this index's."""
        from .encoders import same_encoder

        fingerprint = encoder if isinstance(encoder, Mapping) else encoder.fingerprint()
        if self.encoder and not same_encoder(dict(fingerprint), self.encoder):
            diff = {
                k: (self.encoder.get(k), fingerprint.get(k)) for k in set(self.encoder) | set(fingerprint)
            }
            diff = {k: v for k, v in diff.items() if v[0] != v[1]}
            raise EncoderMismatchError(
                f"this SID index was built with encoder {self.encoder.get('model')!r} but the vectors come from "
                f"{fingerprint.get('model')!r} (differs in {diff}); encode with the index's encoder, "
                "or rebuild the index with `peft-grounded build-sids --encoder ...`"
            )

    def quantize(self, vectors: Any, encoder: Any = None) -> np.ndarray:
        """k-means codes ``[m, n_kmeans_levels]`` of new vectors (nearest codeword per level, no dedup)."""
        from .rqkmeans import quantize

        if encoder is not None:
            self.check_encoder(encoder)
        if self.quantizer != "rqkmeans":
            raise ValueError(
                f"this index was built by an {self.quantizer}, whose codes come from its encoder network, which "
                "the index does not store; rebuild the index with the new items included"
            )
        array = np.asarray(vectors, dtype=np.float32)
        if array.ndim != 2 or array.shape[1] != self.dim:
            raise EncoderMismatchError(
                f"vectors of shape {array.shape} do not match the index's {self.dim}-d encoder "
                f"{self.encoder.get('model')!r}; encode with that encoder"
            )
        codes, _ = quantize(array, self.codebooks, self.normalize_residuals)
        return codes.numpy()

    def add_items(self, catalogue: Any, **kwargs: Any) -> SIDIndex:
        """A new version of this index with the items of ``catalogue`` added (this one is unchanged).

        Existing SIDs stay bit for bit; new tokens (disambiguation codes) are appended, and the child's
        ``parent`` is this index's fingerprint. See :func:`peft_grounded.sids.grow.add_items`."""
        from .grow import add_items

        return add_items(self, catalogue, **kwargs)

    # ------------------------------------------------------------------------------------------ export

    def to_lcrec_json(self) -> dict[str, list[str]]:
        """``{item_id: ["<a_12>", "<b_3>", ...]}``, the LC-Rec / MiniOneRec ``.index.json`` layout."""
        tokens = self.token_strings
        offsets = np.cumsum((0, *self.codes_per_level[:-1]))
        return {
            item: [tokens[o + c] for o, c in zip(offsets, row, strict=True)]
            for item, row in zip(self.item_ids, self.codes.tolist(), strict=True)
        }

    def summary(self) -> str:
        from .quality import format_quality

        head = (
            f"SID index: {self.n_items} items, levels {list(self.codes_per_level)} "
            f"({self.n_tokens} tokens), dim {self.dim}, encoder {self.encoder.get('model', '?')}"
        )
        return head + ("\n" + format_quality(self.quality) if self.quality else "")

    # ------------------------------------------------------------------------------------------ files

    def save(self, directory: str | Path) -> Path:
        """Write ``sid_index.json`` + ``sid_index.safetensors`` into ``directory`` atomically; returns it.

        The folder is locked while it is written (a concurrent save there stops with an error)."""
        from .._locks import output_lock

        with output_lock(directory, "SID index save"):
            return self._save(Path(directory))

    def _save(self, directory: Path) -> Path:
        from safetensors.numpy import save

        directory.mkdir(parents=True, exist_ok=True)
        tensors: dict[str, np.ndarray] = {"codes": self.codes.astype(np.int64)}
        for level, book in enumerate(self.codebooks):
            tensors[f"codebook.{level}"] = np.ascontiguousarray(book, dtype=np.float32)
        for variant, matrix in self.centroids.items():
            tensors[f"centroids.{variant}"] = np.ascontiguousarray(matrix, dtype=np.float32)
        if self.item_interactions is not None:
            tensors["item_interactions"] = np.asarray(self.item_interactions, dtype=np.int64)
        payload = save(tensors, metadata={"format": FORMAT, "version": str(self.version)})
        meta = {
            "format": FORMAT,
            "version": self.version,
            "package_version": _package_version(),
            "n_items": self.n_items,
            "codes_per_level": list(self.codes_per_level),
            "disambiguation_level": self.disambiguation_level,
            "normalize_residuals": self.normalize_residuals,
            "quantizer": self.quantizer,
            "token_template": self.token_template,
            "tokens": self.token_strings,
            "centroid_variants": sorted(self.centroids),
            "encoder": self.encoder,
            "text_template": self.text_template,
            "quality": self.quality,
            "build_config": self.build_config,
            "tensors": {
                "file": tensor_file_name(hashlib.sha256(payload).hexdigest()),
                "bytes": len(payload),
                "sha256": hashlib.sha256(payload).hexdigest(),
            },
            "item_ids": self.item_ids,
            "item_categories": None
            if self.item_categories is None
            else [list(c) for c in self.item_categories],
            "parent": self.parent,
            "lineage": list(self.lineage),
        }
        # the tensor file is named by its content: writing it never touches the file the current JSON names,
        # so a crash at any point leaves a loadable index (the old one, or the new one)
        atomic_write(directory / meta["tensors"]["file"], payload)
        atomic_write(directory / JSON_NAME, json.dumps(meta, ensure_ascii=False).encode("utf-8"))
        remove_unnamed_tensor_files(directory)  # a file another index JSON there names stays
        for stale in directory.glob(
            ".sid_index*.tmp"
        ):  # a killed save's temporary files (the folder is locked)
            stale.unlink(missing_ok=True)
        return directory

    @classmethod
    def load(cls, path: str | Path, verify: bool = True) -> SIDIndex:
        """Read an index saved by :meth:`save` (``path``: its directory or its ``sid_index.json``)."""
        from safetensors import SafetensorError
        from safetensors.numpy import load

        path = Path(path)
        directory = path.parent if path.suffix == ".json" else path
        json_path = directory / JSON_NAME
        fix = REBUILD
        if not json_path.is_file():
            raise IndexFileError(f"no SID index at {directory} (missing {JSON_NAME}); {fix}")
        _own_file(json_path, directory)
        try:
            meta = read_json(json_path, fix=fix)
        except ValueError as err:
            raise IndexFileError(str(err)) from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise IndexFileError(f"{json_path} is not a peft_grounded SID index; {fix}")
        _check_meta(meta, json_path)
        if meta["version"] > FORMAT_VERSION:
            raise IndexFileError(
                f"{json_path} has format version {meta['version']}, newer than this peft_grounded reads "
                f"({FORMAT_VERSION}); upgrade peft_grounded"
            )
        record = meta.get("tensors")
        if not isinstance(record, dict) or not {"file", "bytes", "sha256"} <= set(record):
            raise IndexFileError(f"{json_path} lacks its tensor-file record (an incomplete index); {fix}")
        name = record["file"]
        if not isinstance(name, str) or not TENSOR_FILE_PATTERN.fullmatch(name):
            raise IndexFileError(
                f"{json_path} names the tensor file {name!r}, not a file of the index's own folder "
                "(sid_index.<16 hex digits>.safetensors): a foreign or tampered index; " + fix
            )
        tensor_path = directory / name
        if not tensor_path.is_file():
            raise IndexFileError(f"{tensor_path} is missing; {fix}")
        _own_file(tensor_path, directory)
        payload = tensor_path.read_bytes()
        if len(payload) != record["bytes"]:
            raise IndexFileError(
                f"{tensor_path} has {len(payload)} bytes, {record['bytes']} expected: truncated or from "
                f"another save; {fix}"
            )
        if verify and hashlib.sha256(payload).hexdigest() != record["sha256"]:
            raise IndexFileError(
                f"{tensor_path} fails its SHA-256 check: corrupted or from another save; {fix}"
            )
        try:
            tensors = load(payload)
        except (SafetensorError, ValueError) as err:
            raise IndexFileError(f"{tensor_path} cannot be read ({err}); {fix}") from None
        n_books = len(meta["codes_per_level"]) - int(meta["disambiguation_level"])
        try:
            return cls(
                item_ids=list(meta["item_ids"]),
                codes=tensors["codes"],
                codes_per_level=tuple(meta["codes_per_level"]),
                codebooks=[tensors[f"codebook.{lv}"] for lv in range(n_books)],
                centroids={v: tensors[f"centroids.{v}"] for v in meta["centroid_variants"]},
                disambiguation_level=bool(meta["disambiguation_level"]),
                normalize_residuals=bool(meta["normalize_residuals"]),
                quantizer=meta.get("quantizer", "rqkmeans"),
                token_template=meta["token_template"],
                encoder=meta["encoder"],
                text_template=meta["text_template"],
                quality=meta["quality"],
                build_config=meta["build_config"],
                item_interactions=tensors.get("item_interactions"),
                item_categories=None
                if meta.get("item_categories") is None
                else [tuple(c) for c in meta["item_categories"]],
                version=int(meta["version"]),
                parent=meta.get("parent"),
                lineage=list(meta.get("lineage") or []),
            )
        except KeyError as err:
            raise IndexFileError(f"{directory} lacks {err} (an incomplete or foreign index); {fix}") from None
        except IndexFileError as err:  # the arrays disagree with each other or with the JSON
            raise IndexFileError(f"{json_path}: {err} (a damaged or foreign index); {fix}") from None
        except (TypeError, ValueError) as err:
            raise IndexFileError(f"{json_path} cannot be used ({err}); {fix}") from None
