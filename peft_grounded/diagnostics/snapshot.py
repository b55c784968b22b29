"""``GeometrySnapshot``: one checkpoint's new-token rows and what is known about their tokens, in memory.

Which tokens a heatmap shows, and its matrix (:func:`select_heatmap_tokens`, :func:`heatmap_matrix`), are below.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from peft_grounded.diagnostics.matrices import as_matrix, cosine_similarity_matrix
from peft_grounded.sids.index import level_index, level_name


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(x.shape) if hasattr(x, "shape") else np.shape(x)


@dataclass
class GeometrySnapshot:
    """The SID rows of one checkpoint (e.g. ``stage="init"``, ``"grounded"``, ``"sft"``) and their context.

    Every per-token field is aligned with ``sid_tokens`` (the SID index's token order); optional
    fields switch on the diagnostics that need them:

    * ``vocab_rows`` (the base vocabulary's input-embedding rows, same width) -> text tokens in the
      heatmap and nearest vocabulary tokens; ``vocab_tokens`` (decoded strings, one per row) names
      them, ``exclude_vocab_ids`` (e.g. special tokens) keeps ids out of the nearest-token search;
    * ``reference`` (a codebook or centroid vector per SID token, any width) -> RSA, the semantic
      contrast target for R^2 and purity in the source space;
    * ``categories`` (a category per token; only level-0 tokens are used, others may be ``None``)
      -> neighbourhood purity;
    * ``frequencies`` (code frequency per token) -> popularity R^2;
    * ``semantic_target`` (any per-token scalar) replaces the default semantic target (each
      reference vector's score on the reference's first principal component);
    * ``sid_levels`` (level per token) is parsed from default-template strings (``<a_12>``) if absent.

    Shapes are checked at construction; a mismatch raises ``ValueError`` naming the field and the fix.
    """

    name: str
    sid_rows: Any
    sid_tokens: Sequence[str]
    stage: str = ""
    vocab_rows: Any | None = None
    vocab_tokens: Sequence[str] | None = None
    reference: Any | None = None
    sid_levels: Sequence[int] | None = None
    categories: Sequence[str | None] | None = None
    frequencies: Sequence[float] | Any | None = None
    semantic_target: Sequence[float] | Any | None = None
    exclude_vocab_ids: Sequence[int] | None = None

    def __post_init__(self) -> None:
        self.sid_tokens = list(self.sid_tokens)
        self.validate()

    @property
    def n_tokens(self) -> int:
        return len(self.sid_tokens)

    @property
    def width(self) -> int:
        return _shape(self.sid_rows)[1]

    @property
    def vocab_size(self) -> int | None:
        return None if self.vocab_rows is None else _shape(self.vocab_rows)[0]

    def levels(self) -> list[int] | None:
        """Level of each SID token: ``sid_levels`` or parsed from the token strings (None if unknown)."""
        return list(self.sid_levels) if self.sid_levels is not None else infer_levels(self.sid_tokens)

    def validate(self) -> None:
        """Raise ``ValueError`` if the fields do not describe the same tokens."""
        where = f"snapshot {self.name!r}"
        if not self.name:
            raise ValueError("a snapshot needs a non-empty name (it labels plots and tables)")
        shape = _shape(self.sid_rows)
        n = len(self.sid_tokens)
        if len(shape) != 2:
            raise ValueError(f"{where}: sid_rows must be a (tokens x width) matrix, got shape {shape}")
        if shape[0] != n:
            raise ValueError(
                f"{where}: {shape[0]} SID rows but {n} SID token strings; take the rows of exactly "
                "the SID index's tokens, in its order"
            )
        if n == 0:
            raise ValueError(f"{where}: no SID tokens")
        if len(set(self.sid_tokens)) != n:
            duplicate = next(t for t in self.sid_tokens if self.sid_tokens.count(t) > 1)
            raise ValueError(f"{where}: SID token {duplicate!r} appears more than once")
        if self.vocab_rows is not None:
            vocab_shape = _shape(self.vocab_rows)
            if len(vocab_shape) != 2 or vocab_shape[1] != shape[1]:
                raise ValueError(
                    f"{where}: vocab_rows of shape {vocab_shape} do not match SID rows of width {shape[1]}; "
                    "pass the same model's input-embedding rows of the original vocabulary"
                )
            if self.vocab_tokens is not None and len(self.vocab_tokens) != vocab_shape[0]:
                raise ValueError(
                    f"{where}: {len(self.vocab_tokens)} vocab_tokens for {vocab_shape[0]} vocab_rows; "
                    "decode every vocabulary row id (tokenizer.convert_ids_to_tokens(range(V)))"
                )
            if self.exclude_vocab_ids is not None and any(
                not 0 <= int(i) < vocab_shape[0] for i in self.exclude_vocab_ids
            ):
                raise ValueError(f"{where}: exclude_vocab_ids must lie in [0, {vocab_shape[0]})")
        elif self.vocab_tokens is not None or self.exclude_vocab_ids is not None:
            raise ValueError(f"{where}: vocab_tokens / exclude_vocab_ids given without vocab_rows")
        if self.reference is not None:
            ref_shape = _shape(self.reference)
            if len(ref_shape) != 2 or ref_shape[0] != n:
                raise ValueError(
                    f"{where}: reference of shape {ref_shape} for {n} SID tokens; give one codebook or "
                    "centroid vector per SID token, in the same order (this index's, not another's)"
                )
        for field in ("sid_levels", "categories", "frequencies", "semantic_target"):
            value = getattr(self, field)
            if value is not None and len(value) != n:
                raise ValueError(
                    f"{where}: {field} has {len(value)} entries for {n} SID tokens; give one per token"
                )


def check_compatible(snapshots: Sequence[GeometrySnapshot]) -> None:
    """Raise ``ValueError`` unless the snapshots can be compared side by side (same tokens, same order)."""
    if not snapshots:
        raise ValueError("no snapshots to compare")
    names = [s.name for s in snapshots]
    if len(set(names)) != len(names):
        raise ValueError(f"snapshot names must be unique, got {names}")
    first = snapshots[0]
    for other in snapshots[1:]:
        if other.n_tokens != first.n_tokens:
            raise ValueError(
                f"snapshot {other.name!r} has {other.n_tokens} SID tokens but {first.name!r} has "
                f"{first.n_tokens}; compare checkpoints built with the same SID index"
            )
        if other.sid_tokens != first.sid_tokens:
            position = next(
                i for i, (a, b) in enumerate(zip(first.sid_tokens, other.sid_tokens, strict=True)) if a != b
            )
            same_set = set(other.sid_tokens) == set(first.sid_tokens)
            raise ValueError(
                f"snapshot {other.name!r} lists different SID tokens from {first.name!r} (position {position}: "
                f"{other.sid_tokens[position]!r} vs {first.sid_tokens[position]!r}); "
                + (
                    "same tokens in another order: take the rows in the SID index's order"
                    if same_set
                    else "compare checkpoints built with the same SID index"
                )
            )
    sizes = {s.vocab_size for s in snapshots if s.vocab_size is not None}
    if len(sizes) > 1:
        raise ValueError(
            f"the snapshots' vocabularies differ in size ({sorted(sizes)}); compare checkpoints of one base model"
        )


# Which tokens a cosine-similarity heatmap shows (text tokens, then SID tokens by level), and its matrix.

_SID_TOKEN = re.compile(r"^<([a-z]+)_(\d+)>$")


def parse_sid_token(token: str) -> tuple[int, int] | None:
    """``(level, code)`` of a token in the default template (``<a_12>`` -> (0, 12)), else ``None``."""
    match = _SID_TOKEN.match(token)
    if match is None:
        return None
    return level_index(match.group(1)), int(match.group(2))


def infer_levels(tokens: Sequence[str]) -> list[int] | None:
    """The level of every token when all follow the default template, else ``None``."""
    parsed = [parse_sid_token(token) for token in tokens]
    if any(p is None for p in parsed):
        return None
    return [p[0] for p in parsed if p is not None]


def _natural_key(token: str) -> tuple[tuple[int, int, str], ...]:
    chunks = re.split(r"(\d+)", token)
    return tuple((1, int(c), "") if c.isdigit() else (0, 0, c) for c in chunks if c)


@dataclass(frozen=True)
class HeatmapSelection:
    """Which tokens a similarity heatmap shows: text tokens first, then SID tokens grouped by level."""

    text_ids: np.ndarray  # vocabulary row ids, ascending
    sid_indices: np.ndarray  # positions in the SID token list, ordered by (level, code)
    sid_groups: tuple[str, ...]  # block label of each selected SID token (its level letter)
    notes: tuple[str, ...]  # what was clamped, for the report


def select_heatmap_tokens(
    sid_tokens: Sequence[str],
    n_sid: int = 50,
    vocab_size: int | None = None,
    n_text: int = 50,
    *,
    sid_levels: Sequence[int] | None = None,
    text_ids: Sequence[int] | None = None,
    exclude_ids: Sequence[int] | None = None,
    seed: int = 0,
    strict: bool = False,
) -> HeatmapSelection:
    """Pick ``n_text`` vocabulary tokens and ``n_sid`` SID tokens for a cosine-similarity heatmap.

    SID tokens are spread evenly over the levels and, within a level, evenly over the codes, then
    ordered by (level, code) so that any block structure by level shows. Levels come from
    ``sid_levels`` or are parsed from default-template strings; otherwise all tokens form one block
    in natural string order. Text tokens are ``text_ids`` if given, else a seeded uniform sample of
    ``range(vocab_size)`` without ``exclude_ids`` (e.g. special tokens); no text block if
    ``vocab_size`` is None.

    Fewer tokens than asked for: by default the selection is clamped to what exists and a note
    says so (a small demo index still gets its heatmap); ``strict=True`` raises instead.
    """
    notes: list[str] = []
    n_available = len(sid_tokens)
    if n_available == 0:
        raise ValueError("no SID tokens to show")
    if n_sid < 1 or n_text < 0:
        raise ValueError(f"n_sid must be >= 1 and n_text >= 0, got {n_sid} and {n_text}")
    if n_sid > n_available:
        message = f"{n_sid} SID tokens asked for, only {n_available} exist"
        if strict:
            raise ValueError(f"{message}; lower n_sid or pass strict=False to show all of them")
        notes.append(f"{message}: showing all {n_available}.")
        n_sid = n_available

    levels = list(sid_levels) if sid_levels is not None else infer_levels(sid_tokens)
    if levels is not None and len(levels) != n_available:
        raise ValueError(f"{len(levels)} levels given for {n_available} SID tokens")
    by_level: dict[int, list[int]] = {}
    for index in range(n_available):
        by_level.setdefault(levels[index] if levels is not None else 0, []).append(index)
    for members in by_level.values():  # within a level, "<a_2>" before "<a_10>"
        members.sort(key=lambda i: _natural_key(sid_tokens[i]))

    quota = _spread(n_sid, [len(by_level[level]) for level in sorted(by_level)])
    chosen: list[int] = []
    groups: list[str] = []
    for level, count in zip(sorted(by_level), quota, strict=True):
        members = by_level[level]
        picks = np.floor(np.linspace(0, len(members) - 1, count) + 0.5).astype(int) if count else []
        chosen.extend(members[p] for p in picks)
        groups.extend([level_name(level) if levels is not None else "SID"] * count)

    if text_ids is not None:
        ids = np.asarray(sorted(set(int(i) for i in text_ids)), dtype=np.int64)
        if vocab_size is not None and ids.size and (ids[0] < 0 or ids[-1] >= vocab_size):
            raise ValueError(f"text_ids must lie in [0, {vocab_size}), got {ids[0]}..{ids[-1]}")
    elif vocab_size is None or n_text == 0:
        ids = np.zeros(0, dtype=np.int64)
        if n_text and vocab_size is None:
            notes.append("No vocabulary rows given: the heatmap shows SID tokens only.")
    else:
        pool = np.setdiff1d(np.arange(vocab_size), np.asarray(list(exclude_ids or ()), dtype=np.int64))
        if n_text > pool.size:
            message = f"{n_text} text tokens asked for, the vocabulary has {pool.size} eligible"
            if strict:
                raise ValueError(f"{message}; lower n_text")
            notes.append(f"{message}: showing all {pool.size}.")
            n_text = pool.size
        ids = np.sort(np.random.default_rng(seed).choice(pool, size=n_text, replace=False))
    return HeatmapSelection(
        ids.astype(np.int64), np.asarray(chosen, dtype=np.int64), tuple(groups), tuple(notes)
    )


def _spread(total: int, capacities: list[int]) -> list[int]:
    """Split ``total`` as evenly as possible over groups, none above its capacity."""
    quota = [0] * len(capacities)
    remaining = total
    while remaining > 0:
        open_groups = [g for g, cap in enumerate(capacities) if quota[g] < cap]
        share, extra = divmod(remaining, len(open_groups))
        for rank, g in enumerate(open_groups):
            add = min(share + (1 if rank < extra else 0), capacities[g] - quota[g])
            quota[g] += add
            remaining -= add
    return quota


def heatmap_matrix(sid_rows: Any, selection: HeatmapSelection, vocab_rows: Any | None = None) -> np.ndarray:
    """Cosine similarities among the selected text rows followed by the selected SID rows."""
    sids = as_matrix(sid_rows, "SID rows")[selection.sid_indices]
    if selection.text_ids.size == 0:
        return cosine_similarity_matrix(sids)
    if vocab_rows is None:
        raise ValueError("the selection has text tokens but no vocabulary rows were given")
    table = vocab_rows if hasattr(vocab_rows, "detach") else np.asarray(vocab_rows)
    text = as_matrix(table[selection.text_ids], "vocabulary rows")  # index first: no full-vocabulary copy
    if text.shape[1] != sids.shape[1]:
        raise ValueError(f"SID rows have width {sids.shape[1]} but vocabulary rows {text.shape[1]}")
    return cosine_similarity_matrix(np.vstack([text, sids]))
