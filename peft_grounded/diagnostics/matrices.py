"""The rows every diagnostic measures: checked float matrices, cosine similarities and SVDs.

Inputs are 2-D numpy arrays or torch tensors (any dtype, any device); they are converted to float64
numpy arrays, so results do not depend on the checkpoint's precision. Definitions follow ``METHODS.md``.

Speed: the SVDs go through ``torch.linalg`` (float64) on one thread: for matrices of a few thousand
rows, LAPACK's threads cost more than they give, and on a loaded machine they made an SVD several times
slower. Results are numpy arrays either way.

The measures on them follow, each introduced where it starts: spectra and ranks, representational
similarity (RSA), neighbourhood purity, and the nearest vocabulary tokens of each row.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from peft_grounded.precision import one_thread

# Singular values below RTOL x ||rows||_F (of the rows before any centring) count as zero: rows that
# are identical up to rounding then have a centred spectrum of exactly zero, not of amplified noise.
RTOL = 1e-10
# Cosine similarities closer than this count as ties (neighbour search, constant-similarity checks).
TIE_TOL = 1e-9


def as_matrix(x: Any, name: str = "rows", dtype: type = np.float64) -> np.ndarray:
    """``x`` as a finite matrix of ``dtype``; raises ``ValueError`` naming ``name`` otherwise."""
    if hasattr(x, "detach"):  # a torch tensor (any dtype or device), without importing torch here
        x = x.detach().cpu()
        x = (x.double() if dtype == np.float64 else x.float()).numpy()
    array = np.asarray(x, dtype=dtype)
    if array.ndim != 2:
        raise ValueError(f"{name} must be a 2-D matrix (tokens x width), got shape {array.shape}")
    bad = ~np.isfinite(array).all(axis=1)
    if bad.any():
        raise ValueError(
            f"{name} has {int(bad.sum())} row(s) with NaN or inf (first: row {int(np.argmax(bad))}); "
            "the checkpoint is broken or was saved mid-update"
        )
    return array


def as_vector(x: Any, n: int, name: str) -> np.ndarray:
    """``x`` as a finite float64 vector of length ``n``."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().double().numpy()  # numpy has no bf16
    vector = np.asarray(x, dtype=np.float64).reshape(-1)
    if vector.shape[0] != n:
        raise ValueError(f"{name} has {vector.shape[0]} values but there are {n} tokens; give one per token")
    if not np.isfinite(vector).all():
        raise ValueError(f"{name} contains NaN or inf")
    return vector


# ------------------------------------------------------------------------------------- similarities


def normalise_rows(rows: Any, dtype: type = np.float64) -> np.ndarray:
    """Rows scaled to unit L2 norm; all-zero rows stay zero (their cosine with anything is 0)."""
    matrix = as_matrix(rows, dtype=dtype)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return np.divide(matrix, norms, out=np.zeros_like(matrix), where=norms > 0)


def cosine_similarity_matrix(a: Any, b: Any | None = None) -> np.ndarray:
    """Cosine similarities between the rows of ``a`` and those of ``b`` (default: ``a`` itself)."""
    left = normalise_rows(a)
    right = left if b is None else normalise_rows(b)
    if left.shape[1] != right.shape[1]:
        raise ValueError(f"cannot compare rows of width {left.shape[1]} with rows of width {right.shape[1]}")
    return np.clip(left @ right.T, -1.0, 1.0)


def upper_triangle(matrix: np.ndarray) -> np.ndarray:
    """Entries strictly above the diagonal of a square matrix, row by row."""
    rows, cols = np.triu_indices(matrix.shape[0], k=1)
    return matrix[rows, cols]


# ---------------------------------------------------------------------------------------------- SVD


def singular_values(matrix: np.ndarray) -> np.ndarray:
    """Singular values (descending, float64) of a float64 matrix, without singular vectors."""
    import torch

    with one_thread():
        return torch.linalg.svdvals(torch.from_numpy(np.ascontiguousarray(matrix))).numpy()


def thin_svd(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(u, s)`` of the thin SVD of a float64 matrix (``vh`` is not needed here)."""
    import torch

    with one_thread():
        u, s, _ = torch.linalg.svd(torch.from_numpy(np.ascontiguousarray(matrix)), full_matrices=False)
    return u.numpy(), s.numpy()


# Singular-value spectra of the SID rows, with their effective and stable ranks.


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


# Representational similarity analysis (RSA): do the SID rows keep the geometry of their reference vectors?


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


# Neighbourhood purity: do a token's nearest SID rows share its label (e.g. its level-0 code)?


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


# Each SID row's nearest vocabulary tokens by cosine similarity.
#
# The search multiplies in float32 (a large vocabulary in float64 would cost gigabytes, and ranks barely
# change) and picks with ``torch.topk``.


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
