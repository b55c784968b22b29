"""Starting values for new token rows: every initialisation the two papers compare, and a few more.

Each strategy maps one embedding matrix (input embedding or untied output head) to the ``n x d``
starting rows of the new tokens. ``reference`` are the rows of the existing vocabulary the statistics
come from (the original tokens, never the new ones nor padding rows). All math runs in float64 on the
CPU and is deterministic under ``seed``.

=============  ==========================================================================================
``mean``       the exact mean of the reference rows; every new token identical (Hewitt, 2021).
``gaussian``   draws from MVN(mean, cov) of the reference rows (the centroid paper's baseline).
``random``     N(0, initializer_range^2), the model's own initialiser.
``description`` per token, the mean of the matrix's rows for the tokens of a text.
``centroid``   given vectors, projected to the model's width, mean-shifted (and norm-matched).
``tensor``     a given matrix with the model's width, used as is.
``adapter``    the rows of a saved grounded adapter (warm start).
``keep``       the rows the matrix holds already: the wrapped model starts as the base (a no-op start).
=============  ==========================================================================================
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch

from .projection import project_vectors, vocabulary_stats

InitName = Literal["mean", "gaussian", "random", "description", "centroid", "tensor", "adapter", "keep"]
INITS: tuple[str, ...] = get_args(InitName)
DATA_INITS = ("description", "centroid", "tensor", "adapter")  # the starts that take data


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
    if strategy not in _STRATEGY_FNS:
        raise ValueError(f"Unknown init {strategy!r}; choose one of {', '.join(INITS)}.")
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
