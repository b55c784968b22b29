"""Bring semantic vectors (centroids of SID regions) into an LM's embedding space.

Three ways to reach the LM's width ``d_model`` from vectors of width ``d``:

* ``truncate`` -- keep the first ``d_model`` coordinates (needs ``d >= d_model``). This is the centroid
  paper's method: its encoders are Matryoshka-trained (MRL), so a prefix of the vector is itself a
  good embedding.
* ``pca`` -- express the centred vectors in their own principal axes and lay those axes along the
  principal axes of the LM's vocabulary (axis ``j`` of the vectors -> axis ``j`` of the vocabulary).
  Works for any ``d``, keeps the vectors' relative geometry exactly (it is an isometry onto a
  subspace), needs nothing but the two matrices.
* ``lstsq`` -- a ridge-regularised linear map from the encoder space to the LM space, fitted on
  anchors: vocabulary tokens whose strings were encoded by the same encoder, regressed onto their LM
  rows. The map carries the encoder's semantics into the LM's own coordinates.

Then every variant is mean-shifted so that the vectors' mean equals the vocabulary's mean (the
paper's "mean-shifted projection") and, by default, norm-matched: the deviations from the mean are
scaled by one global factor so their RMS norm equals that of the vocabulary rows. Encoders emit
vectors on their own scale (unit-norm for sentence-transformers), unrelated to the LM's; without the
match the new rows are either squashed towards the mean (close to mean init) or blown far outside the
vocabulary. One global factor keeps all cosine and distance ratios of the centroids intact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch

ProjectionName = Literal["auto", "truncate", "pca", "lstsq"]
PROJECTIONS: tuple[str, ...] = get_args(ProjectionName)


def resolve_projection(method: str, d_in: int, d_model: int, has_anchors: bool) -> str:
    """The concrete projection for ``method`` ("auto": lstsq with anchors, truncate if wide enough, else pca)."""
    if method not in PROJECTIONS:
        raise ValueError(f"Unknown centroid projection {method!r}; choose one of {', '.join(PROJECTIONS)}.")
    if method == "auto":
        if has_anchors:
            return "lstsq"
        return "truncate" if d_in >= d_model else "pca"
    if method == "truncate" and d_in < d_model:
        raise ValueError(
            f"Cannot truncate {d_in}-d vectors to the model's width {d_model}: they are narrower. "
            "Use centroid_projection='pca' (no extra data) or 'lstsq' (with init_anchors)."
        )
    if method == "lstsq" and not has_anchors:
        raise ValueError(
            "centroid_projection='lstsq' needs init_anchors={'token_ids': [...], 'vectors': [a, d]}: the ids of "
            "some vocabulary tokens and the vectors the centroids' encoder gives their strings "
            "(peft_grounded.adapter.starts.vocabulary_anchors(tokenizer, encoder) makes them)."
        )
    return method


def _pca_align(vectors: torch.Tensor, reference: VocabularyStats) -> torch.Tensor:
    k = min(vectors.shape[0], vectors.shape[1], reference.width)
    centred = vectors - vectors.mean(dim=0, keepdim=True)
    _, _, vh = torch.linalg.svd(centred, full_matrices=False)
    source_axes = fix_signs(vh[:k].T.contiguous())  # d_in x k
    return (centred @ source_axes) @ reference.principal_axes(k).T


def _lstsq_map(
    vectors: torch.Tensor, anchor_vectors: torch.Tensor, anchor_rows: torch.Tensor, ridge: float
) -> torch.Tensor:
    ones = torch.ones(anchor_vectors.shape[0], 1, dtype=anchor_vectors.dtype)
    x = torch.cat([anchor_vectors, ones], dim=1)
    gram = x.T @ x
    reg = ridge * gram.diagonal()[:-1].mean() * torch.eye(x.shape[1], dtype=x.dtype)
    reg[-1, -1] = 0  # do not shrink the bias
    weights = torch.linalg.solve(gram + reg, x.T @ anchor_rows)
    return torch.cat([vectors, torch.ones(vectors.shape[0], 1, dtype=vectors.dtype)], dim=1) @ weights


def project_vectors(
    vectors: torch.Tensor,
    reference: VocabularyStats | torch.Tensor,
    method: str = "auto",
    *,
    anchors: tuple[torch.Tensor, torch.Tensor] | None = None,
    norm_match: bool = True,
    ridge: float = 1e-3,
) -> torch.Tensor:
    """Project ``vectors`` [n, d] into the space of the vocabulary (its statistics, or its rows [m, d_model]);
    float64 math, float32 out. ``anchors`` is ``(anchor_vectors [a, d], anchor_rows [a, d_model])`` for lstsq.
    """
    if not isinstance(reference, VocabularyStats):
        if reference.ndim != 2:
            raise ValueError("the reference rows must be a 2-d matrix")
        reference = VocabularyStats.of_rows(reference)
    if vectors.ndim != 2:
        raise ValueError("the vectors must be a 2-d matrix")
    x = vectors.detach().to(torch.float64).cpu()
    d_model = reference.width
    concrete = resolve_projection(method, x.shape[1], d_model, anchors is not None)
    if concrete == "truncate":
        projected = x[:, :d_model]
    elif concrete == "pca":
        projected = _pca_align(x, reference)
    else:
        anchor_vectors, anchor_rows = (a.detach().to(torch.float64).cpu() for a in anchors)  # type: ignore[union-attr]
        if anchor_vectors.shape[1] != x.shape[1] or anchor_rows.shape[1] != d_model:
            raise ValueError(
                f"init_anchors do not fit: anchor vectors are {anchor_vectors.shape[1]}-d (centroids are "
                f"{x.shape[1]}-d) and anchor rows {anchor_rows.shape[1]}-d (model is {d_model}-d)."
            )
        projected = _lstsq_map(x, anchor_vectors, anchor_rows, ridge)
    deviations = projected - projected.mean(dim=0, keepdim=True)
    if norm_match:
        own_rms = deviations.norm(dim=1).pow(2).mean().sqrt()
        if own_rms > 0:
            deviations = deviations * (reference.rms_deviation / own_rms)
    return (reference.mean + deviations).to(torch.float32)


# --- stats ---

CHUNK_ROWS = 8192


@dataclass
class VocabularyStats:
    """Mean [d] and unbiased covariance [d, d] of ``count`` rows, in float64 on the CPU."""

    mean: torch.Tensor
    cov: torch.Tensor
    count: int

    @property
    def width(self) -> int:
        return self.mean.shape[0]

    @property
    def rms_deviation(self) -> torch.Tensor:
        """Root mean square of the rows' distances to the mean."""
        return (self.cov.diagonal().sum() * (self.count - 1) / self.count).clamp(min=0).sqrt()

    def principal_axes(self, k: int) -> torch.Tensor:
        """Top-``k`` principal axes (columns), largest variance first, with a deterministic sign."""
        _, vectors = torch.linalg.eigh(self.cov)
        return fix_signs(vectors.flip(-1)[:, :k])

    @classmethod
    def of_rows(cls, rows: torch.Tensor) -> VocabularyStats:
        return vocabulary_stats(rows, slice(0, rows.shape[0]))


def fix_signs(axes: torch.Tensor) -> torch.Tensor:
    """Make the largest-magnitude entry of each column positive (LAPACK's sign is arbitrary)."""
    signs = torch.sign(axes.gather(0, axes.abs().argmax(dim=0, keepdim=True)))
    signs[signs == 0] = 1
    return axes * signs


def vocabulary_stats(
    weight: torch.Tensor, rows: slice | torch.Tensor, chunk: int = CHUNK_ROWS
) -> VocabularyStats:
    """Moments of ``weight[rows]`` (a slice, or a tensor of row indices), read ``chunk`` rows at a time."""
    index = torch.arange(weight.shape[0])[rows] if isinstance(rows, slice) else torch.as_tensor(rows)
    count = int(index.numel())
    if count == 0:
        raise ValueError("No existing vocabulary rows to take statistics from (the reference set is empty).")
    width = weight.shape[1]
    total = torch.zeros(width, dtype=torch.float64)
    gram = torch.zeros(width, width, dtype=torch.float64)
    shift = weight.detach()[index[0]].to("cpu", torch.float64)  # shifted sums keep the float64 math stable
    for start in range(0, count, chunk):
        block = (
            weight.detach()[index[start : start + chunk].to(weight.device)].to("cpu", torch.float64) - shift
        )
        total += block.sum(dim=0)
        gram += block.T @ block
    centre = total / count
    cov = (gram - count * torch.outer(centre, centre)) / max(count - 1, 1)
    return VocabularyStats(mean=centre + shift, cov=(cov + cov.T) / 2, count=count)
