"""Residual k-means (RQ-KMeans) in torch: deterministic, chunked (memory linear in the items), CPU or GPU.

``r_1 = z``; at each level ``l``: (optionally ``r_l <- r_l / ||r_l||``), fit k-means on ``r_l``,
``c_l = argmin_k ||r_l - q_k||``, ``r_{l+1} = r_l - q_{c_l}``.

* :func:`kmeans`: Lloyd's algorithm with greedy k-means++ seeding (on a subsample of
  ``init_sample_per_code * K`` points, never on zero residuals), empty and dead clusters restarted by
  splitting the largest, and an optional size-constrained (balanced) refinement in which no cluster
  holds more than ``ceil(n / K)`` points.
* :func:`fit_rqkmeans` / :func:`quantize`: the residual stack; ``sample_size`` fits the codebooks on a
  random subsample then assigns every item in chunks, which is how catalogues of millions of items run.

Distances are computed ``chunk_size`` rows at a time (``chunk_size x K`` floats), so memory is the input,
one residual copy and ``O(chunk_size (K + d))``; everything is seeded by one ``torch.Generator``.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from peft_grounded._threads import one_thread

logger = logging.getLogger(__name__)

BALANCE_MODES = ("none", "last", "all")


class QuantizationError(ValueError):
    """Input the quantiser cannot use; the message says what to change."""


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
class KMeansResult:
    centroids: torch.Tensor  # [K, d]
    labels: torch.Tensor  # [n] int64
    inertia: float  # sum of squared distances to the assigned centroid
    n_iter: int
    converged: bool


@dataclass
class RQKMeansResult:
    codebooks: list[torch.Tensor]  # per level [K_l, d]
    codes: torch.Tensor  # [n, L] int64
    residual: torch.Tensor  # [n, d], what is left after the last level
    level_mse: list[float]  # mean squared residual norm after each level
    input_mse: float  # mean squared norm of the input vectors (first level's residual)
    stats: list[dict[str, Any]] = field(default_factory=list)  # per level: iterations, seconds, converged


def check_vectors(x: np.ndarray | torch.Tensor, min_rows: int = 1, what: str = "vectors") -> torch.Tensor:
    """A float32 2-D tensor view of ``x``; raises on a wrong shape, too few rows, NaN or inf (naming rows)."""
    if isinstance(x, torch.Tensor):
        t = x.detach()  # e.g. an encoder's output that still requires grad
    else:
        with warnings.catch_warnings():  # a read-only memory map is fine: the input is never written
            warnings.filterwarnings("ignore", message=".*not writable.*")
            t = torch.as_tensor(np.asarray(x))
    if t.ndim != 2:
        raise QuantizationError(f"{what} must be a 2-D array [items, dim], got shape {tuple(t.shape)}")
    if t.shape[0] < min_rows:
        raise QuantizationError(f"{what}: {t.shape[0]} rows, at least {min_rows} needed")
    t = t.to(torch.float32)
    bad = torch.zeros(t.shape[0], dtype=torch.bool, device=t.device)
    for s in range(0, t.shape[0], 16384):  # chunked: isfinite on the whole matrix would hold 2x its size
        bad[s : s + 16384] = ~torch.isfinite(t[s : s + 16384]).all(dim=1)
    if bad.any():
        rows = bad.nonzero().flatten().tolist()
        raise QuantizationError(
            f"{what}: {len(rows)} rows hold NaN or inf (rows {rows[:10]}{'...' if len(rows) > 10 else ''}); "
            "check the encoder (fp16 overflow, empty texts) or drop those items"
        )
    return t


def _sq_norms(x: torch.Tensor, chunk: int) -> torch.Tensor:
    out = torch.empty(x.shape[0], dtype=x.dtype, device=x.device)
    for s in range(0, x.shape[0], chunk):
        out[s : s + chunk] = x[s : s + chunk].pow(2).sum(1)
    return out


def cluster_sums(x: torch.Tensor, labels: torch.Tensor, k: int, chunk: int = 16384) -> torch.Tensor:
    """Per-cluster sums of the rows of ``x`` ``[k, d]`` (a sparse one-hot product, chunked; faster than
    ``index_add_`` on CPU)."""
    sums = torch.zeros(k, x.shape[1], dtype=x.dtype, device=x.device)
    for s in range(0, x.shape[0], chunk):
        part = labels[s : s + chunk]
        rows = torch.arange(part.numel(), device=x.device)
        onehot = torch.sparse_coo_tensor(
            torch.stack([part, rows]),
            torch.ones(part.numel(), dtype=x.dtype, device=x.device),
            (k, part.numel()),
            check_invariants=False,
        )
        sums += torch.sparse.mm(onehot, x[s : s + chunk])
    return sums


def assign(
    x: torch.Tensor, centroids: torch.Tensor, chunk: int = 16384, x_norm: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Nearest centroid of each row and the squared distance to it (chunked; ``x_norm``: cached ``|x|^2``)."""
    x_norm = _sq_norms(x, chunk) if x_norm is None else x_norm
    c_norm = centroids.pow(2).sum(1)
    labels = torch.empty(x.shape[0], dtype=torch.int64, device=x.device)
    dist = torch.empty(x.shape[0], dtype=x.dtype, device=x.device)
    for s in range(0, x.shape[0], chunk):
        xs = x[s : s + chunk]
        d = torch.addmm(c_norm, xs, centroids.T, alpha=-2.0)
        best, idx = d.min(1)
        labels[s : s + chunk] = idx
        dist[s : s + chunk] = (best + x_norm[s : s + chunk]).clamp_min_(0.0)
    return labels, dist


def _topk_candidates(
    x: torch.Tensor, centroids: torch.Tensor, m: int, chunk: int, x_norm: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    c_norm = centroids.pow(2).sum(1)
    cand = torch.empty(x.shape[0], m, dtype=torch.int64, device=x.device)
    cdist = torch.empty(x.shape[0], m, dtype=x.dtype, device=x.device)
    for s in range(0, x.shape[0], chunk):
        xs = x[s : s + chunk]
        d = torch.addmm(c_norm, xs, centroids.T, alpha=-2.0)
        vals, idx = d.topk(m, dim=1, largest=False, sorted=True)
        cand[s : s + chunk] = idx
        cdist[s : s + chunk] = vals + x_norm[s : s + chunk, None]
    return cand, cdist.clamp_min_(0.0)


def _accept(props: torch.Tensor, dists: torch.Tensor, remaining: torch.Tensor) -> torch.Tensor:
    """Which proposals clusters accept: each takes, by increasing distance, as many proposers as it has room
    for. Returns a mask aligned with ``props``."""
    d = dists.to(torch.float64)
    key = props.to(torch.float64) * (float(d.max()) + 1.0) + d  # sort by (cluster, distance) in one pass
    order = torch.argsort(key, stable=True)
    sp = props[order]
    counts = torch.bincount(sp, minlength=remaining.numel())
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(sp.numel(), device=sp.device) - starts[sp]
    ok = torch.empty_like(sp, dtype=torch.bool)
    ok[order] = rank < remaining[sp]
    return ok


def balanced_assign(
    x: torch.Tensor,
    centroids: torch.Tensor,
    capacity: int,
    candidates: int = 16,
    chunk: int = 16384,
    x_norm: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Assignment with at most ``capacity`` points per cluster (greedy by distance, vectorised).

    Round ``r``: every unassigned point proposes to its ``r``-th nearest centroid; each cluster accepts the
    closest proposers it has room for. Points whose ``candidates`` nearest clusters all fill up then
    propose to their nearest cluster that still has room, until all are placed. Memory ``O(n x candidates)``.
    """
    n, k = x.shape[0], centroids.shape[0]
    if capacity * k < n:
        raise QuantizationError(f"capacity {capacity} x {k} clusters < {n} points")
    m = min(candidates, k)
    x_norm = _sq_norms(x, chunk) if x_norm is None else x_norm
    cand, cdist = _topk_candidates(x, centroids, m, chunk, x_norm)
    labels = torch.full((n,), -1, dtype=torch.int64, device=x.device)
    dist = torch.zeros(n, dtype=x.dtype, device=x.device)
    remaining = torch.full((k,), capacity, dtype=torch.int64, device=x.device)
    todo = torch.arange(n, device=x.device)

    def take(props: torch.Tensor, d: torch.Tensor) -> None:
        nonlocal todo, remaining
        ok = _accept(props, d, remaining)
        placed = todo[ok]
        labels[placed] = props[ok]
        dist[placed] = d[ok]
        remaining = remaining - torch.bincount(props[ok], minlength=k)
        todo = todo[~ok]

    for r in range(m):
        if todo.numel() == 0:
            break
        take(cand[todo, r], cdist[todo, r])
    c_norm = centroids.pow(2).sum(1)
    while todo.numel():
        d = torch.addmm(c_norm, x[todo], centroids.T, alpha=-2.0)
        d[:, remaining <= 0] = float("inf")
        best, props = d.min(1)
        take(props, (best + x_norm[todo]).clamp_min_(0.0))
    return labels, dist


def kmeans_plusplus(
    x: torch.Tensor, k: int, generator: torch.Generator, local_trials: int | None = None
) -> torch.Tensor:
    """Greedy k-means++ seeding (Arthur & Vassilvitskii, 2007; the greedy form scikit-learn uses): each next
    centre is the best, by resulting potential, of ``local_trials`` (default ``2 + ln k``) points drawn with
    probability ~ D(x)^2."""
    n = x.shape[0]
    trials = local_trials or 2 + int(math.log(k))
    first = int(torch.randint(n, (1,), generator=generator))
    centers = torch.empty(k, x.shape[1], dtype=x.dtype, device=x.device)
    centers[0] = x[first]
    x_norm = x.pow(2).sum(1)
    d2 = (x_norm - 2 * (x @ centers[0]) + x_norm[first]).clamp_min_(0.0)
    for j in range(1, k):
        cum = torch.cumsum(d2.double(), 0)
        total = float(cum[-1])
        if total > 0:
            u = torch.rand(trials, generator=generator, dtype=torch.float64).to(cum.device) * total
            cand = torch.searchsorted(cum, u, right=True).clamp_max_(n - 1)
        else:  # fewer distinct points than k: any point (duplicate centres become empty clusters)
            cand = torch.randint(n, (1,), generator=generator).to(x.device)
        dc = (x_norm[:, None] - 2 * (x @ x[cand].T) + x_norm[cand][None, :]).clamp_min_(0.0)  # [n, trials]
        new_d2 = torch.minimum(d2[:, None], dc)
        best = int(new_d2.sum(0).argmin())
        centers[j] = x[cand[best]]
        d2 = new_d2[:, best].contiguous()
    return centers


def _split_largest(
    centroids: torch.Tensor, counts: torch.Tensor, empty: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """Give each empty (or dead) cluster half of the currently largest one (faiss' rule for empty
    clusters): both centroids move a tiny random step apart, so the next assignment splits that cluster's
    points between them. (Re-seeding from the farthest points instead makes singleton clusters, whose
    zero residuals then distort the next level.)"""
    centroids, counts = centroids.clone(), counts.clone()
    scale = centroids.norm(dim=1).mean().clamp_min(1e-12) * 1e-3
    for e in empty.tolist():
        big = int(counts.argmax())
        step = torch.randn(centroids.shape[1], generator=generator).to(centroids) * scale
        centroids[e] = centroids[big] + step
        centroids[big] = centroids[big] - step
        counts[e] = counts[big] // 2
        counts[big] -= counts[e]
    return centroids


def _lloyd(
    x: torch.Tensor,
    centroids: torch.Tensor,
    step: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    max_iter: int,
    tol: float,
    chunk_size: int,
    generator: torch.Generator,
    dead_fraction: float = 0.0,
) -> KMeansResult:
    """Alternate ``step`` (assignment) and centroid updates until the labels settle or ``tol`` is met.

    Clusters with fewer than ``max(1, dead_fraction * n / k)`` points are dead codes: they restart by
    splitting the largest cluster (see :func:`_split_largest`)."""
    k = centroids.shape[0]
    dead_below = max(1.0, dead_fraction * x.shape[0] / k)
    labels, dist = step(centroids)
    inertia, converged, n_iter = float(dist.sum()), False, 0
    while n_iter < max_iter:
        n_iter += 1
        sums = cluster_sums(x, labels, k, chunk_size)
        counts = torch.bincount(labels, minlength=k)
        centroids = torch.where(counts[:, None] > 0, sums / counts.clamp_min(1)[:, None], centroids)
        empty = (counts < dead_below).nonzero().flatten()
        if empty.numel():
            centroids = _split_largest(centroids, counts, empty, generator)
        new_labels, dist = step(centroids)
        new_inertia = float(dist.sum())
        changed = bool((new_labels != labels).any())
        labels = new_labels
        improvement = (inertia - new_inertia) / max(inertia, 1e-30)
        inertia = new_inertia
        if not changed or (0 <= improvement < tol and not empty.numel()):
            converged = True
            break
    return KMeansResult(centroids, labels, inertia, n_iter, converged)


def kmeans(
    x: torch.Tensor,
    k: int,
    *,
    balanced: bool = False,
    max_iter: int = 30,
    balanced_iter: int = 10,
    tol: float = 1e-4,
    generator: torch.Generator | None = None,
    init_sample_per_code: int = 64,
    chunk_size: int = 16384,
    dead_fraction: float = 0.05,
) -> KMeansResult:
    """Lloyd's k-means with k-means++ seeding; stops when the labels settle or the inertia improves by less
    than ``tol`` (relative). The returned labels are the assignment to the returned centroids.

    Dead codes (clusters under ``dead_fraction`` of the mean cluster size, and empty ones) restart by
    splitting the largest cluster, as dead codes of a VQ codebook are restarted. In high dimension a
    seed with a smaller norm than the others is the nearest seed of almost every point; without restarts
    Lloyd's iterations settle on one huge cluster and many singletons.

    ``balanced``: after the unconstrained run, up to ``balanced_iter`` more iterations with the
    size-constrained assignment (no cluster above ``ceil(n / k)`` points), so the final labels are balanced.
    """
    n, _ = x.shape
    if k > n:
        raise QuantizationError(f"k-means with {k} codes needs at least {k} items, got {n}")
    gen = generator or torch.Generator().manual_seed(0)
    x_norm = _sq_norms(x, chunk_size)
    # Seed from rows with a non-degenerate norm: in residual k-means, items alone in their cluster at the
    # previous level have a zero residual, and a seed at the origin captures nearly every item.
    pool = (x_norm > 1e-6 * x_norm.median()).nonzero().flatten()
    if pool.numel() < k:
        pool = torch.arange(n, device=x.device)
    seed_rows = min(pool.numel(), max(k, init_sample_per_code * k))
    if seed_rows < pool.numel():
        pool = pool[torch.randperm(pool.numel(), generator=gen)[:seed_rows].to(x.device)]
    with one_thread(x.device):
        centroids = kmeans_plusplus(x[pool], k, gen)
    result = _lloyd(
        x,
        centroids,
        lambda c: assign(x, c, chunk_size, x_norm),
        max_iter,
        tol,
        chunk_size,
        gen,
        dead_fraction,
    )
    if not balanced:
        return result
    capacity = math.ceil(n / k)
    refined = _lloyd(
        x,
        result.centroids,
        lambda c: balanced_assign(x, c, capacity, chunk=chunk_size, x_norm=x_norm),
        balanced_iter,
        tol,
        chunk_size,
        gen,
    )
    refined.n_iter += result.n_iter
    return refined


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
    input_mse = float(_sq_norms(residual, chunk).mean())
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
        level_mse.append(float(_sq_norms(residual, chunk).mean()))
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
