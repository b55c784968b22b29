"""Residual quantisers of item vectors into SID codes: residual k-means (RQ-KMeans, :func:`fit_rqkmeans`) and
RQ-VAE (:func:`fit_rqvae`, below), both in torch.

Residual k-means (RQ-KMeans) in torch: deterministic, chunked (memory linear in the items), CPU or GPU.

``r_1 = z``; at each level ``l``: (optionally ``r_l <- r_l / ||r_l||``), fit k-means on ``r_l``,
``c_l = argmin_k ||r_l - q_k||``, ``r_{l+1} = r_l - q_{c_l}``.

Each level is a :func:`~.kmeans.kmeans` (:mod:`.kmeans`: seeding, restarts, balanced refinement).
:func:`fit_rqkmeans` / :func:`quantize` are the residual stack; ``sample_size`` fits the codebooks on a
random subsample then assigns every item in chunks, which is how catalogues of millions of items run.

Distances are computed ``chunk_size`` rows at a time (``chunk_size x K`` floats), so memory is the input,
one residual copy and ``O(chunk_size (K + d))``; everything is seeded by one ``torch.Generator``.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from .kmeans import QuantizationError, assign, balanced_assign, check_vectors, cluster_sums, kmeans, sq_norms

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


# An RQ-VAE (TIGER / LC-Rec style), the learned alternative to RQ-KMeans.
#
# An MLP encoder maps an item vector ``x`` (dim ``d``) to a latent ``z`` (dim ``latent_dim``); ``L`` residual
# codebooks quantise ``z`` exactly as RQ-KMeans does (``c_l = argmin_k |r_l - e_k|``, ``r_{l+1} = r_l - e_{c_l}``);
# an MLP decoder reconstructs ``x`` from the quantised latent. Training minimises
#
#     |x - dec(z_q)|^2 + sum_l ( |sg(r_l) - e_{c_l}|^2 + beta |r_l - sg(e_{c_l})|^2 )
#
# with the straight-through estimator ``z_q = z + sg(sum_l e_{c_l} - z)``. The codebooks start from
# RQ-KMeans on the initial latents (LC-Rec's k-means init); after each epoch one Lloyd step per level moves
# each codeword to the mean of the residuals it quantises (so the codebooks keep up with the encoder,
# which plain gradient steps on a small catalogue do not), and a code no item used during the epoch
# restarts at a random current residual of its level (dead-code restart), so the codebooks do not collapse.
#
# Everything is seeded: model initialisation, batches and restarts draw from one seed, without touching
# torch's global random state.


@dataclass(frozen=True)
class RQVAEConfig:
    """Settings of the RQ-VAE (defaults follow LC-Rec's, scaled to a CPU)."""

    codes_per_level: tuple[int, ...] = (256, 256, 256)
    latent_dim: int = 32
    hidden: tuple[int, ...] = (512, 256, 128)
    epochs: int = 100
    batch_size: int = 1024
    lr: float = 1e-3
    weight_decay: float = 1e-4
    beta: float = 0.25
    seed: int = 0
    kmeans_init: bool = True
    device: str = "cpu"

    def __post_init__(self) -> None:
        object.__setattr__(self, "codes_per_level", tuple(int(k) for k in self.codes_per_level))
        object.__setattr__(self, "hidden", tuple(int(h) for h in self.hidden))
        if not self.codes_per_level or min(self.codes_per_level) < 1:
            raise QuantizationError(f"codes_per_level must be >= 1 each, got {self.codes_per_level}")
        from .. import checks

        problems = [
            checks.int_at_least("latent_dim", self.latent_dim, 1),
            None if all(h >= 1 for h in self.hidden) else f"hidden sizes must be >= 1, got {self.hidden}",
            checks.int_at_least("epochs", self.epochs, 1, flag="--rqvae-epochs"),
            checks.int_at_least("batch_size", self.batch_size, 1),
            checks.number_in("lr", self.lr, 0, low_open=True),
            checks.number_in("weight_decay", self.weight_decay, 0),
            checks.number_in("beta", self.beta, 0),
            checks.seed("seed", self.seed, flag="--seed"),
        ]
        try:
            checks.raise_problems("RQVAEConfig", problems)
        except checks.SettingsError as err:
            raise QuantizationError(str(err)) from None
        checks.check_device(self.device)


def _mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class RQVAE(nn.Module):
    """Encoder, residual codebooks, decoder."""

    def __init__(self, dim: int, config: RQVAEConfig) -> None:
        super().__init__()
        self.encoder = _mlp([dim, *config.hidden, config.latent_dim])
        self.decoder = _mlp([config.latent_dim, *reversed(config.hidden), dim])
        self.codebooks = nn.ParameterList(
            nn.Parameter(torch.randn(k, config.latent_dim) * 0.1) for k in config.codes_per_level
        )

    def quantize(
        self, z: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """``(codes [n, L], quantised latent, final residual, residual entering each level)``."""
        residual, quantised = z, torch.zeros_like(z)
        codes, entering = [], []
        for book in self.codebooks:
            labels, _ = assign(residual.detach(), book.detach())
            entering.append(residual)
            q = book[labels]
            codes.append(labels)
            quantised = quantised + q
            residual = residual - q.detach()  # each level's residual carries gradient to the encoder only
        return torch.stack(codes, 1), quantised, residual, entering

    def forward(self, x: torch.Tensor, beta: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(loss, reconstruction loss, codes)``."""
        z = self.encoder(x)
        codes, quantised, _, entering = self.quantize(z)
        vq = z.new_zeros(())
        for level, r in enumerate(entering):
            q = self.codebooks[level][codes[:, level]]
            vq = vq + ((r.detach() - q) ** 2).sum(1).mean() + beta * ((r - q.detach()) ** 2).sum(1).mean()
        z_q = z + (quantised - z).detach()
        recon = ((self.decoder(z_q) - x) ** 2).sum(1).mean()
        return recon + vq, recon, codes


@dataclass
class RQVAEResult:
    model: RQVAE
    codebooks: list[torch.Tensor]  # latent space, per level [K_l, latent_dim]
    codes: torch.Tensor  # [n, L]
    residual: torch.Tensor  # [n, latent_dim] final latent residual
    reconstruction_mse: float  # mean |x - dec(z_q)|^2
    input_mse: float  # mean |x|^2
    level_mse: list[float]  # mean |r_{l+1}|^2 / mean |z|^2 in latent space, per level
    stats: dict[str, Any] = field(default_factory=dict)


def fit_rqvae(vectors: np.ndarray | torch.Tensor, config: RQVAEConfig | None = None) -> RQVAEResult:
    """Train an RQ-VAE on ``vectors`` and code every row."""
    config = config or RQVAEConfig()
    x = check_vectors(vectors, what="item vectors")
    n = x.shape[0]
    k_max = max(config.codes_per_level)
    if k_max > n:
        raise QuantizationError(f"{k_max} codes per level but only {n} items; use codes <= {n}")
    device = torch.device(config.device)
    x = x.to(device)
    start = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = RQVAE(x.shape[1], config).to(device)
        gen = torch.Generator().manual_seed(config.seed)
        if config.kmeans_init:
            with torch.no_grad():
                init = fit_rqkmeans(
                    model.encoder(x),
                    RQKMeansConfig(
                        codes_per_level=config.codes_per_level, seed=config.seed, device=config.device
                    ),
                )
                for book, centroids in zip(model.codebooks, init.codebooks, strict=True):
                    book.copy_(centroids)
        optimiser = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
        history = []
        for _ in range(config.epochs):
            used = [torch.zeros(k, dtype=torch.bool, device=device) for k in config.codes_per_level]
            order = torch.randperm(n, generator=gen).to(device)
            total = 0.0
            for s in range(0, n, config.batch_size):
                batch = x[order[s : s + config.batch_size]]
                loss, recon, codes = model(batch, config.beta)
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
                total += float(recon.detach()) * len(batch)
                for level in range(len(used)):
                    used[level][codes[:, level]] = True
            history.append(total / n)
            _refresh_codebooks(model, x, used, gen)
    model.eval()
    with torch.no_grad():
        z = model.encoder(x)
        codes, quantised, residual, entering = model.quantize(z)
        recon = float(((model.decoder(quantised) - x) ** 2).sum(1).mean())
        z_energy = float((z**2).sum(1).mean())
        level_mse = [float((r**2).sum(1).mean()) / z_energy for r in [*entering[1:], residual]]
    return RQVAEResult(
        model=model,
        codebooks=[b.detach().clone() for b in model.codebooks],
        codes=codes,
        residual=residual,
        reconstruction_mse=recon,
        input_mse=float((x**2).sum(1).mean()),
        level_mse=level_mse,
        stats={"epochs": config.epochs, "seconds": round(time.perf_counter() - start, 3), "loss": history},
    )


@torch.no_grad()
def _refresh_codebooks(model: RQVAE, x: torch.Tensor, used: list[torch.Tensor], gen: torch.Generator) -> None:
    """After an epoch, one Lloyd step per level on (a sample of) the current latents: each codeword moves to
    the mean of the residuals it quantises, so the codebooks keep up with the encoder; codes no item used
    during the epoch restart at random current residuals of their level (dead-code restart)."""
    sample = x[torch.randperm(x.shape[0], generator=gen)[: min(x.shape[0], 65536)].to(x.device)]
    residual = model.encoder(sample)
    for level, book in enumerate(model.codebooks):
        labels, _ = assign(residual, book)
        counts = torch.bincount(labels, minlength=book.shape[0])
        sums = cluster_sums(residual, labels, book.shape[0])
        book.copy_(torch.where(counts[:, None] > 0, sums / counts.clamp_min(1)[:, None], book))
        dead = (~used[level] | (counts == 0)).nonzero().flatten()
        if dead.numel():
            pick = torch.randint(len(sample), (dead.numel(),), generator=gen).to(x.device)
            book[dead] = residual[pick]
        residual = residual - book[assign(residual, book)[0]]
