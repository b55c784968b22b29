"""Residual k-means (RQ-KMeans) in torch: deterministic, chunked (memory linear in the items), CPU or GPU.

``r_1 = z``; at each level ``l``: (optionally ``r_l <- r_l / ||r_l||``), fit k-means on ``r_l``,
``c_l = argmin_k ||r_l - q_k||``, ``r_{l+1} = r_l - q_{c_l}``.

Each level is a :func:`~.kmeans.kmeans` (:mod:`.kmeans`: seeding, restarts, balanced refinement).
:func:`fit_rqkmeans` / :func:`quantize` are the residual stack; ``sample_size`` fits the codebooks on a
random subsample then assigns every item in chunks, which is how catalogues of millions of items run.

Distances are computed ``chunk_size`` rows at a time (``chunk_size x K`` floats), so memory is the input,
one residual copy and ``O(chunk_size (K + d))``; everything is seeded by one ``torch.Generator``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .kmeans import QuantizationError, assign, balanced_assign, check_vectors, kmeans, sq_norms

logger = logging.getLogger(__name__)

BALANCE_MODES = ("none", "last", "all")


@dataclass(frozen=True)
class RQKMeansConfig:
    """Settings of residual k-means. ``balanced``: ``"none"``, ``"last"`` (last level only) or ``"all"``."""

    codes_per_level: tuple[int, ...] = (256, 256, 256)
    normalize_residuals: bool = False
    balanced: str = "none"
    max_iter: int = 30
    balanced_iter: int = 10
    tol: float = 1e-4
    seed: int = 0
    init_sample_per_code: int = 64
    dead_fraction: float = 0.05
    sample_size: int | None = None
    chunk_size: int = 16384
    device: str = "cpu"

    def __post_init__(self) -> None:
        object.__setattr__(self, "codes_per_level", tuple(int(k) for k in self.codes_per_level))
        if not self.codes_per_level or min(self.codes_per_level) < 1:
            raise QuantizationError(
                f"codes_per_level must be >= 1 each, got {self.codes_per_level} (--codes)"
            )
        if self.balanced not in BALANCE_MODES:
            raise QuantizationError(f"balanced must be one of {BALANCE_MODES}, got {self.balanced!r}")
        from .. import checks

        problems = [
            checks.int_at_least("max_iter", self.max_iter, 1, flag="--max-iter"),
            checks.int_at_least("balanced_iter", self.balanced_iter, 0),
            checks.number_in("tol", self.tol, 0),
            checks.seed("seed", self.seed, flag="--seed"),
            checks.int_at_least("init_sample_per_code", self.init_sample_per_code, 1),
            checks.number_in("dead_fraction", self.dead_fraction, 0, 1, high_open=True),
            checks.int_at_least("sample_size", self.sample_size, 1, flag="--sample-size", none_ok=True),
            checks.int_at_least("chunk_size", self.chunk_size, 1),
        ]
        try:
            checks.raise_problems("RQKMeansConfig", problems)
        except checks.SettingsError as err:
            raise QuantizationError(str(err)) from None
        checks.check_device(self.device)

    def balanced_at(self, level: int) -> bool:
        last = len(self.codes_per_level) - 1
        return self.balanced == "all" or (self.balanced == "last" and level == last)


@dataclass
class RQKMeansResult:
    codebooks: list[torch.Tensor]  # per level [K_l, d]
    codes: torch.Tensor  # [n, L] int64
    residual: torch.Tensor  # [n, d], what is left after the last level
    level_mse: list[float]  # mean squared residual norm after each level
    input_mse: float  # mean squared norm of the input vectors (first level's residual)
    stats: list[dict[str, Any]] = field(default_factory=list)  # per level: iterations, seconds, converged


def _normalize_rows(r: torch.Tensor, chunk: int) -> None:
    for s in range(0, r.shape[0], chunk):
        part = r[s : s + chunk]
        part.div_(part.norm(dim=1, keepdim=True).clamp_min_(1e-12))


def fit_rqkmeans(x: np.ndarray | torch.Tensor, config: RQKMeansConfig | None = None) -> RQKMeansResult:
    """Fit ``len(config.codes_per_level)`` levels of residual k-means and code every row of ``x``."""
    config = config or RQKMeansConfig()
    n = int(np.shape(x)[0]) if not isinstance(x, torch.Tensor) else x.shape[0]
    k_max = max(config.codes_per_level)
    if n == 0:
        raise QuantizationError("no vectors to quantise (empty catalogue)")
    if k_max > n:
        raise QuantizationError(
            f"{k_max} codes per level but only {n} items; every code needs an item: "
            f"use codes <= {n} (e.g. --codes {2 ** int(math.log2(n)) if n > 1 else 1})"
        )
    device = torch.device(config.device)
    residual = check_vectors(x).to(device, copy=True)
    gen = torch.Generator().manual_seed(config.seed)
    fit_rows = None
    if config.sample_size is not None and config.sample_size < n:
        if config.sample_size < k_max:
            raise QuantizationError(f"sample_size {config.sample_size} < {k_max} codes")
        fit_rows = torch.randperm(n, generator=gen)[: config.sample_size].sort().values.to(device)
    chunk = config.chunk_size
    input_mse = float(sq_norms(residual, chunk).mean())
    codebooks, level_mse, stats = [], [], []
    codes = torch.empty(n, len(config.codes_per_level), dtype=torch.int64, device=device)
    for level, k in enumerate(config.codes_per_level):
        start = time.perf_counter()
        if config.normalize_residuals:
            _normalize_rows(residual, chunk)
        train = residual if fit_rows is None else residual[fit_rows]
        balanced = config.balanced_at(level)
        km = kmeans(
            train,
            k,
            balanced=balanced,
            max_iter=config.max_iter,
            balanced_iter=config.balanced_iter,
            tol=config.tol,
            generator=gen,
            init_sample_per_code=config.init_sample_per_code,
            chunk_size=chunk,
            dead_fraction=config.dead_fraction,
        )
        if fit_rows is None:
            labels = km.labels
        elif balanced:
            labels = balanced_assign(residual, km.centroids, math.ceil(n / k), chunk=chunk)[0]
        else:
            labels = assign(residual, km.centroids, chunk)[0]
        codes[:, level] = labels
        for s in range(0, n, chunk):
            residual[s : s + chunk] -= km.centroids[labels[s : s + chunk]]
        codebooks.append(km.centroids)
        level_mse.append(float(sq_norms(residual, chunk).mean()))
        stats.append(
            {"level": level, "iterations": km.n_iter, "converged": km.converged, "balanced": balanced}
            | {"seconds": round(time.perf_counter() - start, 3)}
        )
        logger.info("level %d: %d iterations, mse %.5f", level, km.n_iter, level_mse[-1])
    return RQKMeansResult(codebooks, codes, residual, level_mse, input_mse, stats)


def quantize(
    x: np.ndarray | torch.Tensor,
    codebooks: Sequence[torch.Tensor | np.ndarray],
    normalize_residuals: bool = False,
    chunk_size: int = 16384,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes ``[n, L]`` (nearest codeword at each level, no capacity limit) and the final residual."""
    residual = check_vectors(x).clone()
    codes = torch.empty(residual.shape[0], len(codebooks), dtype=torch.int64)
    for level, book in enumerate(codebooks):
        book = torch.as_tensor(book, dtype=torch.float32)
        if book.shape[1] != residual.shape[1]:
            raise QuantizationError(
                f"vectors have dimension {residual.shape[1]} but the codebooks {book.shape[1]}: "
                "encode with the encoder the index was built with"
            )
        if normalize_residuals:
            _normalize_rows(residual, chunk_size)
        labels, _ = assign(residual, book, chunk_size)
        codes[:, level] = labels
        for s in range(0, residual.shape[0], chunk_size):
            residual[s : s + chunk_size] -= book[labels[s : s + chunk_size]]
    return codes, residual
