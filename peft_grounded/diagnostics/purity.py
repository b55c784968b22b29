"""Neighbourhood purity: do a token's nearest SID rows share its label (e.g. its level-0 code)?"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from peft_grounded.diagnostics.matrices import TIE_TOL, as_matrix, cosine_similarity_matrix


@dataclass(frozen=True)
class PurityResult:
    """Neighbourhood purity P_m: mean share of a token's m nearest neighbours with its label."""

    purity: float
    per_token: np.ndarray
    chance: float
    m: int
    n_tokens: int


def neighbourhood_purity(rows: Any, labels: Sequence[Hashable | None], m: int = 10) -> PurityResult:
    """P_m over the labelled rows (label ``None`` = unlabelled: left out as query and as neighbour).

    Neighbours are by cosine similarity, the token itself excluded. Ties at the m-th neighbour (within
    ``TIE_TOL``) are shared out in expectation, as a random tie-break would on average: identical
    rows get the chance level, whatever order the tokens come in. ``chance`` is that level,
    the mean over tokens of ``(n_label - 1) / (n - 1)``.
    """
    matrix = as_matrix(rows)
    if len(labels) != matrix.shape[0]:
        raise ValueError(f"{len(labels)} labels for {matrix.shape[0]} rows; give one label (or None) per row")
    keep = np.array([label is not None for label in labels], dtype=bool)
    kept_labels = [label for label in labels if label is not None]
    n = len(kept_labels)
    if n < 2:
        raise ValueError(f"purity needs at least 2 labelled tokens, got {n}")
    if not 1 <= m <= n - 1:
        raise ValueError(f"m={m} neighbours asked for, but only {n - 1} other labelled tokens exist")
    _, codes = np.unique(np.array([str(label) for label in kept_labels]), return_inverse=True)
    codes = codes.reshape(-1)
    same = codes[:, None] == codes[None, :]
    np.fill_diagonal(same, False)

    sims = cosine_similarity_matrix(matrix[keep])
    np.fill_diagonal(sims, -np.inf)
    threshold = -np.sort(-sims, axis=1)[:, m - 1 : m]
    above = sims > threshold + TIE_TOL
    tied = np.abs(sims - threshold) <= TIE_TOL
    np.fill_diagonal(tied, False)
    slots = m - above.sum(axis=1)
    same_above = (above & same).sum(axis=1)
    same_tied = (tied & same).sum(axis=1)
    per_token = (same_above + slots * same_tied / np.maximum(tied.sum(axis=1), 1)) / m

    counts = np.bincount(codes)
    chance = float(np.mean((counts[codes] - 1) / (n - 1)))
    return PurityResult(float(per_token.mean()), per_token, chance, m, n)
