"""``GeometrySnapshot``: one checkpoint's new-token rows and what is known about their tokens, in memory."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from peft_grounded.diagnostics.heatmaps import infer_levels


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
