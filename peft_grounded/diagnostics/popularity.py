"""Popularity R^2_q: how well the top principal components of the SID rows predict a per-token target."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from peft_grounded.diagnostics.matrices import RTOL, as_matrix, as_vector, thin_svd


@dataclass(frozen=True)
class PrincipalComponents:
    """PCA of rows: scores on the non-degenerate components, and the centred rows' singular values."""

    scores: np.ndarray  # (n, k) by decreasing variance; components under the tolerance are left out
    singular_values: np.ndarray  # all of them, descending, those under the tolerance set to 0

    @property
    def n_rows(self) -> int:
        return self.scores.shape[0]


def principal_components(rows: Any) -> PrincipalComponents:
    """PCA of the mean-centred rows (one SVD; reuse it for the centred spectrum and every R^2 target).

    Singular values under ``RTOL * ||rows||_F`` (of the rows before centring) count as zero.
    """
    if isinstance(rows, PrincipalComponents):
        return rows
    matrix = as_matrix(rows)
    tol = RTOL * float(np.linalg.norm(matrix))
    u, s = thin_svd(matrix - matrix.mean(axis=0, keepdims=True))
    keep = s > tol
    return PrincipalComponents(u[:, keep] * s[keep], np.where(keep, s, 0.0))


def principal_score(vectors: Any, component: int = 0) -> np.ndarray:
    """Each vector's coordinate on one principal component: a scalar semantic target for contrast."""
    scores = principal_components(vectors).scores
    if component >= scores.shape[1]:
        raise ValueError(f"the vectors have only {scores.shape[1]} non-degenerate principal components")
    return scores[:, component]


@dataclass(frozen=True)
class PCRegression:
    """R^2 of a linear regression of a per-token target on the top-q principal components."""

    r2: float
    q: int
    cross_validated: bool
    folds: int


def pc_regression_curve(
    rows: Any, target: Any, max_q: int = 10, cv_folds: int = 0, seed: int = 0
) -> list[PCRegression]:
    """:func:`pc_regression_r2` for q = 1..max_q (q clamped as there), principal components computed once."""
    pcs = principal_components(rows)
    y = as_vector(target, pcs.n_rows, "target")
    folds = _folds(pcs.n_rows, cv_folds, seed)
    return [_fit(pcs.scores, y, q, folds) for q in range(1, max_q + 1)]


def pc_regression_r2(rows: Any, target: Any, q: int = 3, cv_folds: int = 0, seed: int = 0) -> PCRegression:
    """How well the top-``q`` principal components of ``rows`` predict ``target`` (ordinary least squares).

    ``rows`` may also be their :func:`principal_components`, computed once for several targets.

    The principal components come from the mean-centred rows, without the target, so they may be
    computed on all rows even when cross-validating. ``cv_folds=0``: in-sample R^2 (in [0, 1]).
    ``cv_folds=k >= 2``: out-of-fold predictions from k shuffled folds (seeded),
    ``R^2 = 1 - PRESS / SS_tot``, which may be negative. ``q`` is clamped to the non-degenerate
    components and so that every fit keeps a residual degree of freedom; ``result.q`` is the q used
    (0 for identical rows, whose R^2 is then 0). A constant target gives NaN.
    """
    if q < 1:
        raise ValueError(f"q must be >= 1, got {q}")
    pcs = principal_components(rows)
    y = as_vector(target, pcs.n_rows, "target")
    return _fit(pcs.scores, y, q, _folds(pcs.n_rows, cv_folds, seed))


def _folds(n: int, cv_folds: int, seed: int) -> list[np.ndarray]:
    if cv_folds == 0:
        return []
    if cv_folds < 2:
        raise ValueError(f"cv_folds must be 0 (in-sample) or >= 2, got {cv_folds}")
    if n < 2 * cv_folds:
        raise ValueError(f"{cv_folds}-fold cross-validation needs at least {2 * cv_folds} tokens, got {n}")
    order = np.random.default_rng(seed).permutation(n)
    return np.array_split(order, cv_folds)


def _fit(scores: np.ndarray, y: np.ndarray, q: int, folds: list[np.ndarray]) -> PCRegression:
    n = y.shape[0]
    smallest_fit = n - max((len(f) for f in folds), default=0)
    q = max(0, min(q, scores.shape[1], smallest_fit - 2))
    ss_tot = float(((y - y.mean()) ** 2).sum())
    if ss_tot <= 0:
        return PCRegression(float("nan"), q, bool(folds), len(folds))
    design = np.hstack([np.ones((n, 1)), scores[:, :q]])
    if not folds:
        coef, *_ = np.linalg.lstsq(design, y, rcond=None)
        residual = y - design @ coef
    else:
        residual = np.empty(n)
        for held_out in folds:
            train = np.setdiff1d(np.arange(n), held_out)
            coef, *_ = np.linalg.lstsq(design[train], y[train], rcond=None)
            residual[held_out] = y[held_out] - design[held_out] @ coef
    return PCRegression(1.0 - float((residual**2).sum()) / ss_tot, q, bool(folds), len(folds))
