"""An RQ-VAE (TIGER / LC-Rec style), the learned alternative to RQ-KMeans.

An MLP encoder maps an item vector ``x`` (dim ``d``) to a latent ``z`` (dim ``latent_dim``); ``L`` residual
codebooks quantise ``z`` exactly as RQ-KMeans does (``c_l = argmin_k |r_l - e_k|``, ``r_{l+1} = r_l - e_{c_l}``);
an MLP decoder reconstructs ``x`` from the quantised latent. Training minimises

    |x - dec(z_q)|^2 + sum_l ( |sg(r_l) - e_{c_l}|^2 + beta |r_l - sg(e_{c_l})|^2 )

with the straight-through estimator ``z_q = z + sg(sum_l e_{c_l} - z)``. The codebooks start from
RQ-KMeans on the initial latents (LC-Rec's k-means init); after each epoch one Lloyd step per level moves
each codeword to the mean of the residuals it quantises (so the codebooks keep up with the encoder,
which plain gradient steps on a small catalogue do not), and a code no item used during the epoch
restarts at a random current residual of its level (dead-code restart), so the codebooks do not collapse.

Everything is seeded: model initialisation, batches and restarts draw from one seed, without touching
torch's global random state.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from .kmeans import QuantizationError, assign, check_vectors, cluster_sums
from .rqkmeans import RQKMeansConfig, fit_rqkmeans

logger = logging.getLogger(__name__)


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
