"""Anchors for the ``lstsq`` centroid projection: the item encoder's vectors of the LM's own vocabulary.

The map from the encoder's space into the LM's embedding space is fitted on the vocabulary itself: encode
the strings of many ordinary vocabulary tokens with the same encoder that made the centroids, and regress
their LM rows onto those vectors (``centroid_projection="lstsq"``, ``init_anchors=...``).
"""

from __future__ import annotations

from typing import Any

import torch


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
