"""Starting values for new token rows, and the projection of semantic vectors into the embedding space.

Each strategy maps one matrix (input embedding or untied head) to the ``n x d`` rows of the new tokens, from
statistics of the ``reference`` rows (the original vocabulary), in float64 on the CPU, deterministic under
``seed``; docs/adapter.md describes each ``init``. ``centroid`` brings vectors of any width to ``d_model``:
``truncate`` keeps the first coordinates (Matryoshka encoders, the centroid paper's method), ``pca`` lays the
vectors' principal axes along the vocabulary's (an isometry onto a subspace), ``lstsq`` fits a ridge-regularised
linear map on anchors (vocabulary tokens whose strings the same encoder encoded). Every projection is then
mean-shifted to the vocabulary's mean and, by default, norm-matched: one global factor scales the deviations
to the vocabulary rows' RMS deviation, keeping all cosine and distance ratios.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch

InitName = Literal["mean", "gaussian", "random", "description", "centroid", "tensor", "adapter", "keep"]
INITS: tuple[str, ...] = get_args(InitName)
DATA_INITS = ("description", "centroid", "tensor", "adapter")  # the starts that take data
ProjectionName = Literal["auto", "truncate", "pca", "lstsq"]
PROJECTIONS: tuple[str, ...] = get_args(ProjectionName)


def check_choice(what: str, value: Any, choices: Sequence[str]) -> None:
    """Raise a ``ValueError`` naming ``choices`` if ``value`` is not one of them."""
    if value not in choices:
        raise ValueError(f"Unknown {what} {value!r}; choose one of {', '.join(choices)}.")


@dataclass
class InitData:
    """What a data-dependent strategy needs, already resolved to tensors and lists."""

    vectors: torch.Tensor | None = None  # centroid: [n, d_any]; tensor / adapter: [n, d_model]
    token_id_lists: list[list[int]] | None = None  # description: token ids of each new token's text
    anchor_token_ids: list[int] | None = None  # lstsq: vocabulary tokens that were encoded ...
    anchor_vectors: torch.Tensor | None = None  # ... and their encoder vectors
    projection: str = "auto"
    norm_match: bool = True


def _mean(weight, tokens, reference, data, generator, std) -> torch.Tensor:
    return reference.mean.unsqueeze(0).expand(len(tokens), -1).clone()


def _gaussian(weight, tokens, reference, data, generator, std) -> torch.Tensor:
    mean, cov = reference.mean, reference.cov
    jitter = 1e-10 * cov.diagonal().mean().clamp(min=1e-30)
    chol = torch.linalg.cholesky(cov + jitter * torch.eye(cov.shape[0], dtype=cov.dtype))
    z = torch.randn(len(tokens), cov.shape[0], generator=generator, dtype=torch.float64)
    return mean + z @ chol.T


def _random(weight, tokens, reference, data, generator, std) -> torch.Tensor:
    return torch.randn(len(tokens), reference.width, generator=generator, dtype=torch.float64) * std


def _description(weight, tokens, reference, data, generator, std) -> torch.Tensor:
    lists = data.token_id_lists
    if lists is None:
        raise ValueError("init='description' needs init_texts: one text per new token.")
    if len(lists) != len(tokens):
        raise ValueError(
            f"init_texts has {len(lists)} entries for {len(tokens)} new tokens; give exactly one per token, "
            "in the order of token_indices."
        )
    mean = reference.mean
    rows, empty = [], []
    new = set(tokens)
    for position, ids in enumerate(lists):
        bad = [i for i in ids if not 0 <= i < weight.shape[0] or i in new]
        if bad:
            raise ValueError(
                f"init_texts[{position}] uses token ids {bad[:5]} that are new tokens or outside the "
                "vocabulary; descriptions must be written with existing tokens."
            )
        if ids:
            rows.append(_gather(weight, ids).mean(dim=0))
        else:  # e.g. a SID code that no item carries: nothing describes it
            empty.append(tokens[position])
            rows.append(mean)
    if empty:
        warnings.warn(
            f"{len(empty)} new tokens have an empty description (e.g. rows {empty[:5]}); they start at the "
            "vocabulary mean.",
            stacklevel=3,
        )
    return torch.stack(rows)


def _centroid(weight, tokens, reference, data, generator, std) -> torch.Tensor:
    vectors = _checked_vectors(data, tokens, width=None)
    anchors = None
    if data.anchor_vectors is not None and data.anchor_token_ids is not None:
        _check_anchor_ids(data.anchor_token_ids, tokens, weight.shape[0])
        anchor_rows = _gather(weight, data.anchor_token_ids)
        anchors = (data.anchor_vectors, anchor_rows)
    projected = project_vectors(
        vectors, reference, data.projection, anchors=anchors, norm_match=data.norm_match
    )
    return projected.to(torch.float64)


def _check_anchor_ids(ids: Sequence[int], tokens: Sequence[int], n_rows: int) -> None:
    """Anchors are rows of the existing vocabulary: an id out of range (a negative one would wrap) or one of
    the new tokens (its row is not the vocabulary's yet) is an error."""
    outside = [i for i in ids if not 0 <= i < n_rows]
    if outside:
        raise ValueError(
            f"init_anchors token_ids holds {len(outside)} ids outside the vocabulary [0, {n_rows}) (e.g. "
            f"{outside[:5]}); use the ids of existing vocabulary tokens, e.g. from "
            "peft_grounded.adapter.starts.vocabulary_anchors(tokenizer, encoder) with this model's tokenizer."
        )
    new = set(tokens)
    anchored_new = [i for i in ids if i in new]
    if anchored_new:
        raise ValueError(
            f"init_anchors token_ids holds {len(anchored_new)} of the new tokens (e.g. {anchored_new[:5]}); anchors "
            "must be existing vocabulary tokens, whose rows the projection is fitted on."
        )


def _keep(weight, tokens, reference, data, generator, std) -> torch.Tensor:
    return _gather(weight, tokens)


def _tensor(weight, tokens, reference, data, generator, std) -> torch.Tensor:
    return _checked_vectors(data, tokens, width=reference.width).to(torch.float64)


def _gather(weight: torch.Tensor, ids: Sequence[int]) -> torch.Tensor:
    return weight[torch.as_tensor(list(ids), device=weight.device)].to("cpu", torch.float64)


def _checked_vectors(data: InitData, tokens: Sequence[int], width: int | None) -> torch.Tensor:
    vectors = data.vectors
    if vectors is None:
        raise ValueError("This initialisation needs init_vectors (one row per new token).")
    if vectors.ndim != 2 or vectors.shape[0] != len(tokens):
        raise ValueError(
            f"init_vectors has shape {tuple(vectors.shape)} but there are {len(tokens)} new tokens: give "
            "exactly one vector per token, in the order of token_indices."
        )
    if not torch.isfinite(vectors).all():
        bad = (~torch.isfinite(vectors)).any(dim=1).nonzero().flatten().tolist()
        raise ValueError(
            f"init_vectors has NaN or Inf in rows {bad[:10]} (token indices "
            f"{[tokens[i] for i in bad[:10]]}); clean or recompute those vectors."
        )
    if width is not None and vectors.shape[1] != width:
        raise ValueError(
            f"init_vectors are {vectors.shape[1]}-d but the model's rows are {width}-d. For vectors of another "
            "width use init='centroid', which projects them (centroid_projection='truncate'|'pca'|'lstsq')."
        )
    return vectors.detach().to(torch.float64).cpu()


_STRATEGY_FNS: dict[str, Callable[..., torch.Tensor]] = {
    "mean": _mean,
    "gaussian": _gaussian,
    "random": _random,
    "description": _description,
    "centroid": _centroid,
    "tensor": _tensor,
    "adapter": _tensor,
    "keep": _keep,
}


def initial_rows(
    strategy: str,
    weight: torch.Tensor,
    token_indices: Sequence[int],
    reference_indices: torch.Tensor | slice,
    data: InitData | None = None,
    *,
    seed: int = 0,
    initializer_range: float = 0.02,
    scale: float = 1.0,
) -> torch.Tensor:
    """Starting rows [n, d] (float32) for ``token_indices`` of ``weight`` under ``strategy``, pulled toward the
    vocabulary mean by ``scale`` (``mean + scale * (row - mean)``; 1: as computed)."""
    check_choice("init", strategy, INITS)
    matrix = weight.detach()
    reference = vocabulary_stats(matrix, reference_indices)
    generator = torch.Generator().manual_seed(int(seed))
    rows = _STRATEGY_FNS[strategy](
        matrix, list(token_indices), reference, data or InitData(), generator, initializer_range
    )
    if scale != 1.0:
        rows = reference.mean + scale * (rows - reference.mean)
    if not torch.isfinite(rows).all():
        raise ValueError(f"init={strategy!r} produced non-finite rows; check the inputs it was given.")
    return rows.to(torch.float32)


# --- anchors ---


def word_tokens(
    tokenizer: Any, vocab_size: int | None = None, n: int = 4000, min_chars: int = 3
) -> list[int]:
    """Ids of up to ``n`` word-like tokens (alphabetic, at least ``min_chars`` letters), spread over the
    original vocabulary (BPE vocabularies put frequent words first, rare fragments last)."""
    size = vocab_size or len(tokenizer)
    candidates = []
    for token_id in range(size):
        text = tokenizer.decode([token_id]).strip()
        if len(text) >= min_chars and text.isalpha():
            candidates.append(token_id)
    if not candidates:
        raise ValueError("The tokenizer has no word-like tokens to anchor the lstsq projection on.")
    if len(candidates) <= n:
        return candidates
    step = len(candidates) / n
    return [candidates[int(i * step)] for i in range(n)]


def vocabulary_anchors(
    tokenizer: Any, encoder: Any, *, vocab_size: int | None = None, n: int = 4000, batch_size: int = 256
) -> dict[str, torch.Tensor]:
    """``{"token_ids", "vectors"}`` for ``GroundedTokenConfig(init_anchors=...)``: ``encoder`` (anything with
    ``encode(texts) -> array``, e.g. :func:`peft_grounded.sids.load_encoder`) applied to the decoded strings
    of word-like vocabulary tokens. Save them with ``safetensors.torch.save_file`` to reuse them."""
    ids = word_tokens(tokenizer, vocab_size, n)
    texts = [tokenizer.decode([i]).strip() for i in ids]
    vectors = torch.as_tensor(encoder.encode(texts, batch_size=batch_size), dtype=torch.float32)
    if vectors.shape[0] != len(ids):
        raise ValueError(f"The encoder returned {vectors.shape[0]} vectors for {len(ids)} token strings.")
    return {"token_ids": torch.as_tensor(ids, dtype=torch.long), "vectors": vectors}


# --- projection ---


def resolve_projection(method: str, d_in: int, d_model: int, has_anchors: bool) -> str:
    """The concrete projection for ``method`` ("auto": lstsq with anchors, truncate if wide enough, else pca)."""
    check_choice("centroid projection", method, PROJECTIONS)
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
        reference = vocabulary_stats(reference, slice(0, reference.shape[0]))
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


def fix_signs(axes: torch.Tensor) -> torch.Tensor:
    """Make the largest-magnitude entry of each column positive (LAPACK's sign is arbitrary)."""
    signs = torch.sign(axes.gather(0, axes.abs().argmax(dim=0, keepdim=True)))
    signs[signs == 0] = 1
    return axes * signs


def vocabulary_stats(weight: torch.Tensor, rows: slice | torch.Tensor, chunk: int = 8192) -> VocabularyStats:
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
