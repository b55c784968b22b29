"""Resolve the data an initialisation was given (tensors, files, texts, saved adapters) into tensors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open

from .._messages import listed
from .strategies import InitData

IN_MEMORY_PREFIX = "in-memory "


def load_tensor(value: Any, *, what: str, key: str = "vectors") -> torch.Tensor:
    """A tensor from a tensor, an array, or a ``.safetensors`` file holding ``key``."""
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, (list, tuple)):
        return torch.as_tensor(value)
    if isinstance(value, (str, Path)):
        text = str(value)
        if text.startswith(IN_MEMORY_PREFIX):
            raise ValueError(
                f"{what} is recorded as {text!r}: the tensor was given in memory when the adapter was made and is "
                "not saved. To load a saved adapter use PeftModel.from_pretrained(base, path) (its rows come from "
                "adapter_model.safetensors); to create a new one, pass the tensor again."
            )
        path = Path(text)
        if not path.is_file():
            raise FileNotFoundError(
                f"{what}: no file at {path}. Pass a tensor or the path of a .safetensors file."
            )
        if path.suffix != ".safetensors":
            raise ValueError(
                f"{what}: {path} is not a .safetensors file; only safetensors are loaded (never pickle)."
            )
        with safe_open(str(path), framework="pt") as handle:
            names = list(handle.keys())
            if key not in names:
                raise KeyError(
                    f"{what}: {path} has no tensor named {key!r} (it has {listed(sorted(names))})."
                )
            return handle.get_tensor(key)
    raise TypeError(f"{what} must be a tensor, an array or a .safetensors path, got {type(value).__name__}.")


def _per_matrix(value: Any, matrix: str) -> Any:
    if isinstance(value, dict) and set(value) <= {"input", "output"}:
        return value.get(matrix, value.get("input"))
    return value


def tokenize_texts(texts: list, tokenizer: Any = None) -> list[list[int]]:
    """Token ids of each description (strings are tokenised by ``tokenizer``, without special tokens)."""
    if all(isinstance(t, (list, tuple)) for t in texts):
        return [[int(i) for i in t] for t in texts]
    if tokenizer is None:
        raise ValueError(
            "init_texts holds strings: tokenise them with the model's tokenizer, "
            "initialize_grounded_rows(model, texts=..., tokenizer=tokenizer), or pass the token ids of each text."
        )
    return [tokenizer(str(t), add_special_tokens=False)["input_ids"] for t in texts]


def resolve_init_data(config: Any, matrix: str) -> InitData:
    """The :class:`InitData` of ``config`` for the ``"input"`` or ``"output"`` matrix (adapter init excluded)."""
    data = InitData(projection=config.centroid_projection, norm_match=config.norm_match)
    runtime = config.runtime_config
    if config.init in ("centroid", "tensor"):
        data.vectors = load_tensor(_per_matrix(runtime.init_vectors, matrix), what="init_vectors")
    if config.init == "description":
        data.token_id_lists = tokenize_texts(list(runtime.init_texts))
    if config.init == "centroid" and runtime.init_anchors is not None:
        anchors = runtime.init_anchors
        if isinstance(anchors, dict):
            ids, vectors = anchors.get("token_ids"), anchors.get("vectors")
            if ids is None or vectors is None:
                raise ValueError("init_anchors must hold 'token_ids' and 'vectors'.")
            data.anchor_token_ids = [int(i) for i in load_tensor(ids, what="init_anchors token_ids").tolist()]
            data.anchor_vectors = load_tensor(vectors, what="init_anchors vectors")
        else:
            data.anchor_token_ids = load_tensor(anchors, what="init_anchors", key="token_ids").long().tolist()
            data.anchor_vectors = load_tensor(anchors, what="init_anchors", key="vectors")
        if len(data.anchor_token_ids) != data.anchor_vectors.shape[0]:
            raise ValueError(
                f"init_anchors has {len(data.anchor_token_ids)} token ids but {data.anchor_vectors.shape[0]} vectors."
            )
    return data
