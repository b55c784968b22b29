"""First and second moments of the vocabulary's rows, computed in chunks (never a float64 copy of it all).

Everything the initialisations need from the existing vocabulary follows from its mean and covariance:
the ``mean`` init, the ``gaussian`` draws, the principal axes the ``pca`` projection aligns to (the
eigenvectors of the covariance), and the RMS deviation that norm matching scales to.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

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
