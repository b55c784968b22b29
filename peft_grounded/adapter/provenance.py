"""What a ``GroundedTokenConfig`` holds beside its hyperparameters: runtime data and creation-time facts.

``GroundedRuntimeConfig`` plays the part of PEFT's ``LoraRuntimeConfig``: the data a data-driven start reads
once, at creation (tensors, arrays, paths), never saved. ``GroundedProvenance`` gathers the facts recorded
when the adapter is made (the base's size and signature, the vocabulary's fingerprint, a description of the
start's data), saved with the adapter and checked when it is loaded.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

IN_MEMORY_PREFIX = "in-memory "

INIT_DATA = ("init_vectors", "init_anchors", "init_texts")


def describe_tensor(value: torch.Tensor | np.ndarray) -> str:
    """The JSON record of an in-memory tensor: dtype, shape and a content hash."""
    tensor = torch.as_tensor(value).detach().cpu().contiguous()
    raw = tensor.reshape(-1).view(torch.uint8)  # the bytes of any dtype (numpy has no bfloat16)
    digest = hashlib.sha256(raw.numpy().tobytes()).hexdigest()[:16]
    return f"{IN_MEMORY_PREFIX}{str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)} sha256={digest}"


def _record(value: Any) -> Any:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return describe_tensor(value)
    if isinstance(value, dict):
        return {k: _record(v) for k, v in value.items()}
    return value


@dataclass
class GroundedRuntimeConfig:
    """Runtime data of a grounded-token config: read at creation, never saved (``to_dict`` drops it)."""

    init_vectors: Any = field(
        default=None,
        metadata={
            "help": "centroid: one vector per new token, any width (tensor, array, or path to a .safetensors "
            "file with a `vectors` tensor); tensor: a [n, d_model] matrix; adapter: path of a saved grounded "
            "adapter. A dict {'input': ..., 'output': ...} gives untied heads their own vectors."
        },
    )
    init_anchors: Any = field(
        default=None,
        metadata={
            "help": "centroid with lstsq projection: {'token_ids': [...], 'vectors': [a, d]} (or a .safetensors "
            "path with those keys), the encoder's vectors of existing vocabulary tokens."
        },
    )
    init_texts: list[str] | list[list[int]] | None = field(
        default=None,
        metadata={
            "help": "description: one text per new token, as token ids (strings are tokenised by "
            "initialize_grounded_rows(model, tokenizer=...))."
        },
    )
    rows_from_checkpoint: bool = field(
        default=False,
        metadata={
            "help": "Set by from_pretrained: the rows come from adapter_model.safetensors, so the start is "
            "skipped and the provenance is checked against the base."
        },
    )

    def record(self) -> dict[str, Any] | None:
        """The JSON record of the data given (tensors as dtype, shape and hash); None when there are none."""
        given = {name: _record(getattr(self, name)) for name in INIT_DATA if getattr(self, name) is not None}
        return given or None


@dataclass
class GroundedProvenance:
    """Facts recorded when the adapter is made, saved with it, and checked when it is loaded onto a base."""

    num_embeddings: int | None = field(
        default=None, metadata={"help": "Rows of the input embedding the adapter was made for."}
    )
    embedding_signature: list[float] | None = field(
        default=None,
        metadata={"help": "Norms of a few fixed rows of the original vocabulary, checked on load."},
    )
    vocab_fingerprint: str | None = field(
        default=None,
        metadata={"help": "sha256 of the original vocabulary's tokens (filled by `add_tokens`)."},
    )
    init_data: dict[str, Any] | None = field(
        default=None,
        metadata={
            "help": "The data the rows started from, described (dtype, shape, hash; paths; token ids)."
        },
    )

    @classmethod
    def coerce(cls, value: Any) -> GroundedProvenance | None:
        """A provenance from itself, its saved dict, or None."""
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, dict):
            unknown = set(value) - {"num_embeddings", "embedding_signature", "vocab_fingerprint", "init_data"}
            if unknown:
                raise ValueError(
                    f"provenance has unknown keys {sorted(unknown)}; it records {cls.__name__}'s fields."
                )
            return cls(**value)
        raise TypeError(
            f"provenance must be a GroundedProvenance, its dict or None, got {type(value).__name__}."
        )
