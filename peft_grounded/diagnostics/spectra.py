"""Singular-value spectra of the SID rows, with their effective and stable ranks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from peft_grounded.diagnostics.matrices import RTOL, as_matrix, singular_values


@dataclass(frozen=True)
class Spectrum:
    """Singular values (descending) of the SID rows and the ranks derived from them."""

    singular_values: np.ndarray
    effective_rank: float
    stable_rank: float
    centred: bool

    @classmethod
    def from_singular_values(cls, values: np.ndarray, centred: bool) -> Spectrum:
        """Ranks of given singular values (descending; values meant as zero already set to 0)."""
        return cls(values, _effective_rank(values), _stable_rank(values), centred)


def spectrum(rows: Any, center: bool = False) -> Spectrum:
    """Singular-value spectrum, effective rank and stable rank of ``rows``.

    * Effective rank (Roy & Vetterli 2007): ``exp(H(p))`` with ``p_i = s_i / sum(s)``; 1 for
      rank-one rows, ``n`` for ``n`` orthonormal rows.
    * Stable rank: ``||A||_F^2 / ||A||_2^2 = sum(s^2) / s_1^2``.

    ``center=False`` (default) measures the rows as the LM uses them, so every construction in
    METHODS.md keeps its meaning: mean init gives effective rank 1, and a shared offset (the
    vocabulary mean added by the centroid init's mean shift) counts as one direction.
    ``center=True`` subtracts the mean row first and measures only the spread around that offset,
    which a large shared offset otherwise hides. Identical rows then have no spread at all: both
    ranks are 0. Singular values under ``RTOL * ||rows||_F`` are treated as 0.
    """
    matrix = as_matrix(rows)
    if matrix.shape[0] == 0:
        raise ValueError("no rows to measure")
    tol = RTOL * float(np.linalg.norm(matrix))
    if center:
        matrix = matrix - matrix.mean(axis=0, keepdims=True)
    values = singular_values(matrix)
    return Spectrum.from_singular_values(np.where(values > tol, values, 0.0), center)


def _effective_rank(values: np.ndarray) -> float:
    total = values.sum()
    if total <= 0:
        return 0.0
    p = values[values > 0] / total
    return float(np.exp(-(p * np.log(p)).sum()))


def _stable_rank(values: np.ndarray) -> float:
    if values.size == 0 or values[0] <= 0:
        return 0.0
    return float((values**2).sum() / values[0] ** 2)


def effective_rank(rows: Any, center: bool = False) -> float:
    """Roy & Vetterli's effective rank of ``rows``; see :func:`spectrum`."""
    return spectrum(rows, center).effective_rank


def stable_rank(rows: Any, center: bool = False) -> float:
    """``||A||_F^2 / ||A||_2^2`` of ``rows``; see :func:`spectrum`."""
    return spectrum(rows, center).stable_rank
