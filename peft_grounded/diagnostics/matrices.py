"""The rows every diagnostic measures: checked float matrices, cosine similarities and SVDs.

Inputs are 2-D numpy arrays or torch tensors (any dtype, any device); they are converted to float64
numpy arrays, so results do not depend on the checkpoint's precision. Definitions follow ``METHODS.md``.

Speed: the SVDs go through ``torch.linalg`` (float64) on one thread: for matrices of a few thousand
rows, LAPACK's threads cost more than they give, and on a loaded machine they made an SVD several times
slower. Results are numpy arrays either way.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from peft_grounded._threads import one_thread

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
