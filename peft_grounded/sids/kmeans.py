"""k-means in torch: deterministic, chunked (memory linear in the items), CPU or GPU.

:func:`kmeans` is Lloyd's algorithm with greedy k-means++ seeding (on a subsample of
``init_sample_per_code * K`` points, never on zero residuals), empty and dead clusters restarted by
splitting the largest, and an optional size-constrained (balanced) refinement in which no cluster holds more
than ``ceil(n / K)`` points. Distances are computed ``chunk_size`` rows at a time (``chunk_size x K``
floats); everything is seeded by one ``torch.Generator``. The residual stack built on it is
:mod:`.quantizers`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from peft_grounded.precision import one_thread


class QuantizationError(ValueError):
    """Input the quantiser cannot use; the message says what to change."""


@dataclass
class KMeansResult:
    centroids: torch.Tensor  # [K, d]
    labels: torch.Tensor  # [n] int64
    inertia: float  # sum of squared distances to the assigned centroid
    n_iter: int
    converged: bool


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


def sq_norms(x: torch.Tensor, chunk: int) -> torch.Tensor:
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
    x_norm = sq_norms(x, chunk) if x_norm is None else x_norm
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
    x_norm = sq_norms(x, chunk) if x_norm is None else x_norm
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
    x_norm = sq_norms(x, chunk_size)
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
