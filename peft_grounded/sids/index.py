"""The SID index: the artefact that the SID stage hands to every later stage.

It holds item -> SID codes, the codebooks of each k-means level, the per-token centroids in two variants,
the quality figures, and the provenance (encoder fingerprint, text template, build settings, format
version). Token rows always follow :func:`~peft_grounded.sids.index.sid_vocabulary` order: level by
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

The index is a plain artefact: data, lookups, the codes of new vectors (:meth:`SIDIndex.quantize`) and its
files (``<dir>/sid_index.json`` + ``<dir>/sid_index.<hash>.safetensors``, see :mod:`.index_files`). What is
computed from it lives with its users: growth in :mod:`peft_grounded.new_items` (``add_items``), code statistics
in :mod:`peft_grounded.diagnostics.diagnose`, texts per token in :mod:`.index`.

The names of SID tokens (one per level and code: ``<a_12>``; :func:`sid_vocabulary`, :func:`add_sid_tokens`)
and :func:`token_descriptions` (one text per SID token, for the adapter's ``init="description"`` start) are
below.
"""

from __future__ import annotations

import hashlib
import json
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .behaviour import ItemVectorMap
from .index_files import (  # the file format; JSON_NAME, IndexFileError and tensors_path are read from here too
    CENTROID_VARIANTS,
    FORMAT_VERSION,
    JSON_NAME,
    REBUILD,
    IndexFileError,
    fields_source,
    read_index,
    save_index,
    tensors_path,
)

# Names of Semantic-ID tokens: one token per (level, code), e.g. ``<a_12>`` for code 12 at level 0.

DEFAULT_TEMPLATE = "<{level}_{code}>"


def level_name(level: int) -> str:
    """Letter of a level: 0 -> 'a', 1 -> 'b', ..., 25 -> 'z', 26 -> 'aa'."""
    if level < 0:
        raise ValueError(f"level must be >= 0, got {level}")
    letters = string.ascii_lowercase
    name = ""
    level += 1
    while level:
        level, rem = divmod(level - 1, 26)
        name = letters[rem] + name
    return name


def level_index(name: str) -> int:
    """Inverse of :func:`level_name`: 'a' -> 0, 'z' -> 25, 'aa' -> 26."""
    if not name or not all("a" <= c <= "z" for c in name):
        raise ValueError(f"a level name is lowercase letters, got {name!r}")
    level = 0
    for letter in name:
        level = level * 26 + (ord(letter) - ord("a") + 1)
    return level - 1


def sid_token(level: int, code: int, template: str = DEFAULT_TEMPLATE) -> str:
    """The token string of ``code`` at ``level`` (``template`` may use ``{level}``, ``{level_index}``, ``{code}``)."""
    return template.format(level=level_name(level), level_index=level, code=code)


def sid_vocabulary(codes_per_level: Sequence[int], template: str = DEFAULT_TEMPLATE) -> list[str]:
    """All SID token strings, level by level, code by code (the order the adapter's rows follow)."""
    tokens = [
        sid_token(level, code, template) for level, n in enumerate(codes_per_level) for code in range(n)
    ]
    if len(set(tokens)) != len(tokens):
        raise ValueError(f"template {template!r} gives the same string to different (level, code) pairs")
    return tokens


def sid_string(codes: Sequence[int], template: str = DEFAULT_TEMPLATE) -> str:
    """The text of one item's SID, e.g. ``<a_12><b_3><c_200>``."""
    return "".join(sid_token(level, code, template) for level, code in enumerate(codes))


def parse_sid(text: str, template: str = DEFAULT_TEMPLATE) -> list[int]:
    """Inverse of :func:`sid_string` for the default-style templates; raises ``ValueError`` on malformed text."""
    pattern = (
        re.escape(template)
        .replace(r"\{level\}", r"(?P<level>[a-z]+)")
        .replace(r"\{code\}", r"(?P<code>\d+)")
        .replace(r"\{level_index\}", r"(?P<level_index>\d+)")
    )
    codes: list[int] = []
    pos = 0
    regex = re.compile(pattern)
    while pos < len(text):
        match = regex.match(text, pos)
        if match is None:
            raise ValueError(f"{text!r} is not a SID in the template {template!r} (at position {pos})")
        expected = level_name(len(codes))
        if "level" in match.groupdict() and match.group("level") != expected:
            raise ValueError(f"{text!r}: level {match.group('level')!r} where {expected!r} was expected")
        codes.append(int(match.group("code")))
        pos = match.end()
    return codes


def add_sid_tokens(
    tokenizer, model, codes_per_level: Sequence[int], template: str = DEFAULT_TEMPLATE, **kwargs
) -> Any:
    """Add one token per (level, code), named by ``template`` (default ``<a_12>``), level by level, with
    :func:`peft_grounded.adapter.add_tokens` (its ``AddedTokens``)."""
    from ..adapter.initialize import add_tokens

    return add_tokens(tokenizer, model, sid_vocabulary(codes_per_level, template), **kwargs)


__all__ = [
    "CENTROID_VARIANTS",
    "DEFAULT_TEMPLATE",
    "JSON_NAME",
    "EncoderMismatchError",
    "IndexFileError",
    "SIDIndex",
    "add_sid_tokens",
    "level_index",
    "level_name",
    "parse_sid",
    "sid_string",
    "sid_token",
    "sid_vocabulary",
    "tensors_path",
    "token_descriptions",
]


class EncoderMismatchError(ValueError):
    """Vectors from another encoder than the one the index was built with."""


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
    vector_map: ItemVectorMap | None = None  # text -> the vectors the index was built from (None: text)

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
        self.folder: Path | None = None  # where it was loaded from or last saved to (not a field: not saved)
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

    def check_adapter(self, config: Any, where: str = "the adapter", recorded: str | None = None) -> None:
        """Raise unless the adapter ``config`` was made for this index's tokens and, where its SID record gives
        the index fingerprint (``recorded``), for this index's codes; ``where`` names the adapter in the message.
        An adapter of an index this one grew from is told to grow first."""
        grow = (
            f"{where} was trained with a parent version of this SID index (fingerprint {recorded}); this "
            "version added items. Grow the adapter first: peft-grounded grow-adapter --adapter ADAPTER "
            "--parent_index PARENT_INDEX --sid_index THIS_INDEX --output_dir GROWN (in Python: "
            "peft_grounded.new_items.grow_adapter(model, tokenizer, parent_index, this_index))."
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
        """Items that growth (:func:`peft_grounded.new_items.add_items`) appended: by the last growth, or by every growth after the
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

    # ------------------------------------------------------------------------------------------ new items

    def text_vectors(
        self, catalogue: Any, encoder: Any = None, *, cache_dir: Any = None, show_progress: bool = False
    ) -> np.ndarray:
        """``[items, dim]``: the items' text as this index encodes it (its text template; ``encoder``, default
        the packaged MiniLM, checked against the index's fingerprint; the embedding cache), read from
        ``catalogue``, which must hold every item."""
        from .catalogue import TextTemplate
        from .encoders import encode_texts, load_encoder

        missing = [i for i in self.item_ids if i not in catalogue.items]
        if missing:
            raise ValueError(
                f"{len(missing)} items of the SID index are not in the catalogue (e.g. {missing[:3]}): pass the "
                "catalogue the index was built (or grown) from"
            )
        encoder = load_encoder(encoder)
        self.check_encoder(encoder)
        template = TextTemplate.from_spec(self.text_template) if self.text_template else TextTemplate()
        texts = template.render_all([catalogue.items[i] for i in self.item_ids])
        vectors = encode_texts(texts, encoder, cache_dir=cache_dir, show_progress=show_progress)
        return np.asarray(vectors, dtype=np.float32)

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

    def index_vectors(self, text_vectors: Any) -> np.ndarray:
        """The encoder's vectors of items brought into the space the index was built in (the text-to-
        behaviour map of a behaviour or mixed index; unchanged for a text index)."""
        array = np.asarray(text_vectors, dtype=np.float32)
        if self.vector_map is None:
            return array
        if array.ndim != 2 or array.shape[1] != self.vector_map.text_dim:
            raise EncoderMismatchError(
                f"vectors of shape {array.shape} do not match the index's {self.vector_map.text_dim}-d encoder "
                f"{self.encoder.get('model')!r} (the index maps its vectors to {self.vector_map.source} "
                "vectors); encode with that encoder"
            )
        return self.vector_map(array)

    def quantize(self, vectors: Any, encoder: Any = None) -> np.ndarray:
        """k-means codes ``[m, n_kmeans_levels]`` of new vectors (nearest codeword per level, no dedup)."""
        from .quantizers import quantize

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
        from .collisions import format_quality

        head = (
            f"SID index: {self.n_items} items, levels {list(self.codes_per_level)} "
            f"({self.n_tokens} tokens), dim {self.dim}, encoder {self.encoder.get('model', '?')}"
        )
        return head + ("\n" + format_quality(self.quality) if self.quality else "")

    # ------------------------------------------------------------------------------------------ files

    def save(self, directory: str | Path) -> Path:
        """Write ``sid_index.json`` + its content-named tensor file into ``directory`` atomically; returns it
        (see :mod:`.index_files`). The folder is locked while it is written (a concurrent save there stops
        with an error)."""
        saved = save_index(self, directory)
        self.folder = Path(directory)
        return saved

    @classmethod
    def load(cls, path: str | Path, verify: bool = True) -> SIDIndex:
        """Read an index saved by :meth:`save` (``path``: its directory or its ``sid_index.json``)."""
        fields = read_index(path, verify)
        try:
            index = cls(**fields)
        except IndexFileError as err:  # the arrays disagree with each other or with the JSON
            raise IndexFileError(
                f"{fields_source(path)}: {err} (a damaged or foreign index); {REBUILD}"
            ) from None
        except (TypeError, ValueError) as err:
            raise IndexFileError(f"{fields_source(path)} cannot be used ({err}); {REBUILD}") from None
        path = Path(path)
        index.folder = path.parent if path.suffix == ".json" else path
        return index


# One text per SID token, for the adapter's ``init="description"`` start.


def token_descriptions(index: SIDIndex, titles: Any, per_token: int = 3, separator: str = "; ") -> list[str]:
    """One text per SID token (row order): the titles of its ``per_token`` most popular items, for the
    adapter's ``init="description"`` (``init_texts``). ``titles``: a ``Catalogue`` or ``{item_id:
    title}``. Popularity is the build catalogue's interaction count (ties: index order); a token no
    item carries gets ``""``."""
    if hasattr(titles, "items") and not isinstance(titles, Mapping):
        titles = {i: item.title for i, item in titles.items.items()}
    popularity = index.item_interactions if index.item_interactions is not None else np.zeros(index.n_items)
    out: list[str] = []
    for level, k in enumerate(index.codes_per_level):
        order = np.lexsort((np.arange(index.n_items), -popularity, index.codes[:, level]))
        column = index.codes[order, level]
        starts = np.searchsorted(column, np.arange(k), "left")
        ends = np.searchsorted(column, np.arange(k), "right")
        for lo, hi in zip(starts, ends, strict=True):
            names = [titles.get(index.item_ids[i], "") for i in order[lo : min(hi, lo + per_token)]]
            out.append(separator.join(n for n in names if n))
    return out
