"""Each SID row's nearest vocabulary tokens by cosine similarity.

The search multiplies in float32 (a large vocabulary in float64 would cost gigabytes, and ranks barely
change) and picks with ``torch.topk``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from peft_grounded.diagnostics.matrices import as_matrix, normalise_rows


@dataclass(frozen=True)
class NearestTokens:
    """For each SID row, the ``k`` most cosine-similar vocabulary rows, best first."""

    ids: np.ndarray  # (n_sid, k) int64 vocabulary row ids
    scores: np.ndarray  # (n_sid, k) cosine similarities


@dataclass(frozen=True)
class UnitRows:
    """Rows scaled to unit norm, float32: a vocabulary prepared once for many nearest-token searches."""

    rows: np.ndarray


def unit_rows(rows: Any, name: str = "vocabulary rows") -> UnitRows:
    """``rows`` normalised to unit L2 norm in float32 (see :func:`nearest_vocabulary`)."""
    if isinstance(rows, UnitRows):
        return rows
    return UnitRows(normalise_rows(as_matrix(rows, name, np.float32), np.float32))


def nearest_vocabulary(
    sid_rows: Any,
    vocab_rows: Any,
    k: int = 10,
    exclude_ids: Sequence[int] | None = None,
    chunk_size: int = 256,
) -> NearestTokens:
    """Top-``k`` vocabulary rows by cosine similarity for each SID row (equal scores: lower id first).

    ``exclude_ids`` (e.g. special tokens) are never returned. Decode the ids with the tokenizer.
    ``vocab_rows`` may be a :class:`UnitRows` (from :func:`unit_rows`) to normalise a large
    vocabulary once for several checkpoints. Works in chunks of ``chunk_size`` SID rows so memory
    stays at chunk_size x vocabulary size.
    """
    import torch

    # float32 here: a large vocabulary in float64 would cost gigabytes, and ranks barely change.
    sids = normalise_rows(as_matrix(sid_rows, "SID rows", np.float32), np.float32)
    vocab = unit_rows(vocab_rows).rows
    if sids.shape[1] != vocab.shape[1]:
        raise ValueError(f"SID rows have width {sids.shape[1]} but vocabulary rows {vocab.shape[1]}")
    excluded = np.unique(np.asarray(list(exclude_ids or ()), dtype=np.int64))
    if excluded.size and (excluded[0] < 0 or excluded[-1] >= vocab.shape[0]):
        raise ValueError(f"exclude_ids must lie in [0, {vocab.shape[0]})")
    n_allowed = vocab.shape[0] - excluded.size
    if not 1 <= k <= n_allowed:
        raise ValueError(f"k={k} nearest tokens asked for, but {n_allowed} vocabulary rows are eligible")
    table = torch.from_numpy(vocab)
    ids = np.empty((sids.shape[0], k), dtype=np.int64)
    scores = np.empty((sids.shape[0], k), dtype=np.float64)
    for start in range(0, sids.shape[0], chunk_size):
        sims = torch.from_numpy(sids[start : start + chunk_size]) @ table.T
        if excluded.size:
            sims[:, torch.from_numpy(excluded)] = -torch.inf
        # one candidate more than needed: a tie between places k and k + 1 goes to the lower id
        values, top = torch.topk(sims, min(k + 1, n_allowed), dim=1)
        for row, (candidates, found) in enumerate(zip(top.numpy(), values.numpy(), strict=True)):
            order = np.lexsort((candidates, -found))[:k]
            ids[start + row] = candidates[order]
            scores[start + row] = np.clip(found[order], -1.0, 1.0)
    return NearestTokens(ids, scores)
