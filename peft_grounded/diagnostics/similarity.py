"""Representational similarity analysis (RSA): do the SID rows keep the geometry of their reference vectors?"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from peft_grounded.diagnostics.matrices import (
    RTOL,
    TIE_TOL,
    as_matrix,
    cosine_similarity_matrix,
    upper_triangle,
)


def rankdata(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties sharing their average rank (as Spearman's correlation needs)."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    return (ends - (counts - 1) / 2.0)[inverse.reshape(-1)]


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson correlation; NaN when either side is constant (the correlation is undefined)."""
    x = np.asarray(x, dtype=np.float64) - np.mean(x)
    y = np.asarray(y, dtype=np.float64) - np.mean(y)
    denom = np.sqrt((x * x).sum() * (y * y).sum())
    return float((x * y).sum() / denom) if denom > 0 else float("nan")


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation (Pearson of average ranks); NaN when either side is constant."""
    return pearson(rankdata(np.asarray(x)), rankdata(np.asarray(y)))


@dataclass(frozen=True)
class RSAResult:
    """Representational similarity between a reference geometry and learned rows."""

    pearson: float
    spearman: float
    n_tokens: int
    n_pairs: int


@dataclass(frozen=True)
class SimilarityPairs:
    """One side of an RSA: the upper triangle of a cosine-similarity matrix and its ranks.

    Build it once with :func:`similarity_pairs` to compare one reference with many checkpoints.
    """

    values: np.ndarray
    ranks: np.ndarray
    n_tokens: int

    @property
    def constant(self) -> bool:
        return bool(np.ptp(self.values) <= TIE_TOL) if self.values.size else True


def centre_rows(matrix: np.ndarray) -> np.ndarray:
    """Rows minus their mean row; rows left with a norm under ``RTOL`` x the largest original row
    norm become exactly zero (identical rows centre to rounding noise, which must not count as spread)."""
    scale = float(np.linalg.norm(matrix, axis=1).max()) if matrix.size else 0.0
    centred = matrix - matrix.mean(axis=0, keepdims=True)
    small = np.linalg.norm(centred, axis=1) <= RTOL * scale
    centred[small] = 0.0
    return centred


def similarity_pairs(vectors: Any, center: bool = False, name: str = "vectors") -> SimilarityPairs:
    """Upper triangle (and its average ranks) of the cosine similarities of ``vectors``' rows.

    ``center=True`` subtracts the mean row first (see :func:`centre_rows`), so a shared offset
    (the vocabulary mean that the centroid init adds) does not compress the similarities.
    """
    matrix = as_matrix(vectors, name)
    if center:
        matrix = centre_rows(matrix)
    values = upper_triangle(cosine_similarity_matrix(matrix))
    return SimilarityPairs(values, rankdata(values), matrix.shape[0])


def rsa(reference: Any, learned: Any, center: bool = False) -> RSAResult:
    """Pearson and Spearman correlation of the upper triangles of two cosine-similarity matrices.

    ``reference[i]`` (a codebook or centroid vector, any width) and ``learned[i]`` (the SID row)
    must describe the same token. The result is invariant to rotations and scalings of either
    side. When one side's similarities are all equal within ``TIE_TOL`` (mean init: every row the
    same) the correlation is undefined and both values are NaN, not rounding noise.

    ``center=True`` compares the geometries around each side's mean row instead (both sides
    centred): invariant to a shared offset too, so rows built as ``offset + scale * reference``
    (centroid init with truncation) score exactly 1. ``reference`` may be a :class:`SimilarityPairs`
    built with the same ``center``, to reuse it across checkpoints.
    """
    if isinstance(reference, SimilarityPairs):
        ref = reference
    else:
        ref = similarity_pairs(reference, center, "reference vectors")
    rows = as_matrix(learned, "learned rows")
    if ref.n_tokens != rows.shape[0]:
        raise ValueError(
            f"{ref.n_tokens} reference vectors for {rows.shape[0]} learned rows; "
            "RSA needs one reference vector per SID token, in the same order"
        )
    if rows.shape[0] < 3:
        raise ValueError(f"RSA needs at least 3 tokens (3 pairs), got {rows.shape[0]}")
    if ref.constant:
        return RSAResult(float("nan"), float("nan"), rows.shape[0], ref.values.size)
    own = upper_triangle(cosine_similarity_matrix(centre_rows(rows) if center else rows))
    if np.ptp(own) <= TIE_TOL:
        return RSAResult(float("nan"), float("nan"), rows.shape[0], own.size)
    return RSAResult(pearson(ref.values, own), pearson(ref.ranks, rankdata(own)), rows.shape[0], own.size)
