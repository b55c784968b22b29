"""Vocabulary extension: add tokens to a tokenizer and a model, resize, and return the rows they own."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence

import torch
from torch import nn


class AddedTokens(list):
    """Row indices of tokens added by :func:`add_tokens` (a ``list[int]``), with what the adapter needs to know.

    Passing it as ``GroundedTokenConfig(token_indices=...)`` also records ``token_strings``,
    ``original_vocab_size`` and ``vocab_fingerprint`` in the config.
    """

    def __init__(
        self, indices: Sequence[int], tokens: Sequence[str], original_vocab_size: int, vocab_fingerprint: str
    ):
        super().__init__(int(i) for i in indices)
        self.tokens = list(tokens)
        self.original_vocab_size = original_vocab_size
        self.vocab_fingerprint = vocab_fingerprint


def vocab_fingerprint(tokenizer, size: int | None = None) -> str:
    """sha256 of the token strings of ids ``0 .. size-1`` (default: the whole tokenizer)."""
    size = len(tokenizer) if size is None else size
    tokens = tokenizer.convert_ids_to_tokens(list(range(size)))
    digest = hashlib.sha256("\n".join("" if t is None else t for t in tokens).encode("utf-8")).hexdigest()
    return f"sha256:{digest}"


def _is_wrapped(model: nn.Module) -> bool:
    from .layer import GroundedTokenLayer

    return hasattr(model, "peft_config") or isinstance(model.get_input_embeddings(), GroundedTokenLayer)


@torch.no_grad()
def fill_with_mean(weight: torch.Tensor, rows: list[int], reference_rows: int) -> None:
    """Set ``rows`` of ``weight`` to the mean of its first ``reference_rows`` rows (a deterministic placeholder)."""
    mean = weight[:reference_rows].double().mean(dim=0).to(weight.dtype)
    weight[torch.as_tensor(rows, device=weight.device)] = mean


def add_tokens(
    tokenizer, model: nn.Module, tokens: Sequence[str], *, pad_to_multiple_of: int | None = None
) -> AddedTokens:
    """Add ``tokens`` to ``tokenizer`` and ``model``; return the indices of their embedding rows.

    Refuses tokens that already exist. Never shrinks the embedding: models whose matrix has more rows
    than ``len(tokenizer)`` (Qwen3) keep them, and the new tokens land on the rows the tokenizer gives
    them. The new rows (input and untied output) are set to the mean of the existing rows, so the
    resized base is deterministic; the adapter's initialisation replaces them.
    """
    tokens = [str(t) for t in tokens]
    if not tokens:
        raise ValueError("No tokens to add.")
    if any(not t for t in tokens):
        raise ValueError("Empty token strings cannot be added.")
    repeated = sorted(t for t, n in Counter(tokens).items() if n > 1)
    if repeated:
        raise ValueError(f"Tokens listed more than once: {repeated[:5]}.")
    if _is_wrapped(model):
        raise ValueError(
            "The model is already wrapped by a PEFT adapter: add tokens to the base model before get_peft_model "
            "(or merge_and_unload() first)."
        )
    vocab = tokenizer.get_vocab()
    existing = [t for t in tokens if t in vocab]
    if existing:
        raise ValueError(
            f"{len(existing)} tokens already exist in the tokenizer (e.g. {existing[:3]}). Adding them again would "
            "reuse rows the model already trained; choose new token strings (e.g. another template)."
        )
    original = len(tokenizer)
    fingerprint = vocab_fingerprint(tokenizer, original)
    added = tokenizer.add_tokens(tokens, special_tokens=False)
    if added != len(tokens):
        raise RuntimeError(f"The tokenizer added {added} of {len(tokens)} tokens.")
    indices = tokenizer.convert_tokens_to_ids(tokens)
    for token, index in zip(tokens[:3] + tokens[-1:], indices[:3] + indices[-1:], strict=True):
        encoded = tokenizer(token, add_special_tokens=False)["input_ids"]
        if encoded != [index]:
            raise RuntimeError(f"Token {token!r} encodes to {encoded}, not to its own id {index}.")
    rows = model.get_input_embeddings().weight.shape[0]
    needed = max(indices) + 1
    if needed > rows:
        model.resize_token_embeddings(needed, pad_to_multiple_of=pad_to_multiple_of, mean_resizing=False)
    reference = min(original, rows)
    fill_with_mean(model.get_input_embeddings().weight, indices, reference)
    head = model.get_output_embeddings()
    if head is not None and head.weight is not model.get_input_embeddings().weight:
        fill_with_mean(head.weight, indices, reference)
    return AddedTokens(indices, tokens, original, fingerprint)


def check_tokenizer(config, tokenizer) -> None:
    """Raise if ``tokenizer`` does not carry the adapter's tokens at its rows, or has another base vocabulary."""
    if config.token_strings is not None:
        found = tokenizer.convert_ids_to_tokens(list(config.token_indices))
        wrong = [
            (i, s, f)
            for i, s, f in zip(config.token_indices, config.token_strings, found, strict=True)
            if s != f
        ]
        if wrong:
            i, s, f = wrong[0]
            raise ValueError(
                f"{len(wrong)} of the adapter's tokens sit elsewhere in this tokenizer (row {i} is {f!r}, the adapter "
                f"expects {s!r}). Add the adapter's token_strings, in order, to the base tokenizer."
            )
    recorded = getattr(config.provenance, "vocab_fingerprint", None)
    if recorded is not None and config.original_vocab_size is not None:
        actual = vocab_fingerprint(tokenizer, config.original_vocab_size)
        if actual != recorded:
            raise ValueError(
                "The tokenizer's base vocabulary differs from the one the adapter was made with "
                f"({actual[:19]}... vs {recorded[:19]}...): use the base model's own tokenizer."
            )
