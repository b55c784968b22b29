"""Adding the tokens, and starting their rows: at creation (:func:`start_rows`) or afterwards from data
(:func:`initialize_grounded_rows`, as PEFT's EVA waits for ``initialize_lora_eva_weights``)."""

from __future__ import annotations

import hashlib
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from torch import nn

from ..checks import listed
from .config import IN_MEMORY_PREFIX, GroundedTokenConfig
from .layer import GroundedTokenLayer
from .saved import adapter_rows
from .starts import DATA_INITS, InitData, initial_rows


def _reference(config: GroundedTokenConfig, rows: int) -> slice | torch.Tensor:
    """The rows of the existing vocabulary that the statistics come from."""
    if config.tokens_are_new:
        return slice(0, config.base_vocab_size)
    keep = torch.ones(rows, dtype=torch.bool)
    keep[torch.as_tensor(config.token_indices)] = False
    return keep.nonzero().flatten()


def start_rows(
    config: GroundedTokenConfig, layer: GroundedTokenLayer, initializer_range: float = 0.02
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The starting input rows (and untied output rows) of ``config``'s new tokens on ``layer``'s weights."""
    weight = layer.base_layer.weight
    index = torch.as_tensor(config.token_indices, device=weight.device)
    head = layer.head
    train_head = head is not None and not layer.tied and config.train_output_rows
    runtime = config.runtime_config
    base_rows = (weight.detach()[index].clone(), head.weight.detach()[index].clone() if train_head else None)
    if runtime.rows_from_checkpoint:  # loading: the rows come from the checkpoint right after this
        return base_rows
    if not config.init_weights:
        # PEFT's init_weights=False, as TrainableTokens has it: random rows (torch.randn from the global generator,
        # in the matrix's dtype), whatever `init` says; for tests that need the adapter to change the output
        return _randn(index, weight), _randn(index, head.weight) if train_head else None
    if config.init == "keep" and config.init_scale == 1.0:
        return base_rows  # the no-op start, exactly (not through the float64 statistics)
    init = config.init
    if not config.has_init_data:
        warnings.warn(
            f"init={init!r} needs "
            + ("init_texts as token ids" if init == "description" else "init_vectors")
            + ": the new rows start at the vocabulary mean until initialize_grounded_rows(model, "
            + ("texts=..., tokenizer=...)" if init == "description" else "vectors=...)")
            + " gives the data.",
            stacklevel=5,
        )
        init = "mean"
    if init == "adapter":
        saved_in, saved_out = adapter_rows(
            runtime.init_vectors, config.token_indices, config.token_strings, width=weight.shape[1]
        )
        if train_head and saved_out is None:
            saved_out = saved_in
        return saved_in, saved_out if train_head else None
    matrices = {"input": weight} | ({"output": head.weight} if train_head else {})
    rows = {}
    for matrix, tensor in matrices.items():
        data = resolve_init_data(config, matrix) if init in DATA_INITS else InitData()
        rows[matrix] = initial_rows(
            init,
            tensor,
            config.token_indices,
            _reference(config, tensor.shape[0]),
            data,
            seed=config.init_seed + (0 if matrix == "input" else 1),
            initializer_range=initializer_range,
            scale=config.init_scale,
        )
    return rows["input"], rows.get("output")


def _randn(index: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    return torch.randn(index.numel(), matrix.shape[1], dtype=matrix.dtype, device=matrix.device)


def initializer_range(model: torch.nn.Module) -> float:
    """The model's ``initializer_range`` (the ``random`` start's standard deviation), 0.02 by default."""
    return getattr(getattr(model, "config", None), "initializer_range", 0.02) or 0.02


def initialize_grounded_rows(
    model: Any,
    *,
    vectors: Any = None,
    anchors: Any = None,
    texts: list | None = None,
    tokenizer: Any = None,
    adapter_name: str | None = None,
) -> Any:
    """Start the rows of a data-driven ``init`` from data, after ``get_peft_model`` (in place; returns ``model``).

    ``vectors``, ``anchors`` and ``texts`` (tokenised by ``tokenizer``) stand for the runtime config's
    ``init_vectors``, ``init_anchors`` and ``init_texts``, whose values serve where none is given. The config
    then holds the data and describes them in ``provenance.init_data``, as a created one does.
    """
    name = adapter_name or model.active_adapter
    config = model.peft_config.get(name)
    if not isinstance(config, GroundedTokenConfig):
        raise TypeError(f"Adapter {name!r} is not a grounded-token adapter.")
    if config.init not in DATA_INITS:
        raise ValueError(
            f"Adapter {name!r} starts with init={config.init!r}, which takes no data; initialize_grounded_rows serves "
            f"{', '.join(DATA_INITS)}."
        )
    layer = model.get_input_embeddings()
    if not isinstance(layer, GroundedTokenLayer) or name not in layer.grounded_embedding:
        raise ValueError(f"Adapter {name!r} has no grounded rows in this model's input embedding.")
    runtime = replace(config.runtime_config, rows_from_checkpoint=False)
    if vectors is not None:
        runtime.init_vectors = vectors
    if anchors is not None:
        runtime.init_anchors = anchors
    if texts is not None or config.init == "description":
        runtime.init_texts = tokenize_texts(
            list(texts if texts is not None else runtime.init_texts or []), tokenizer
        )
    given = replace(config, init_weights=True, runtime_config=runtime)
    if not given.has_init_data:
        raise ValueError(f"init={config.init!r} needs its data: pass vectors= (or texts= with tokenizer=).")
    input_rows, output_rows = start_rows(given, layer, initializer_range(model))
    with torch.no_grad():
        layer.grounded_embedding[name].copy_(input_rows)
        if output_rows is not None and name in layer.grounded_head:
            layer.grounded_head[name].copy_(output_rows)
    config.runtime_config = replace(runtime, rows_from_checkpoint=config.runtime_config.rows_from_checkpoint)
    config.record_start()
    return model


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
        vectors = runtime.init_vectors
        if isinstance(vectors, dict) and set(vectors) <= {"input", "output"}:  # an untied head's own vectors
            vectors = vectors.get(matrix, vectors.get("input"))
        data.vectors = load_tensor(vectors, what="init_vectors")
    if config.init == "description":
        data.token_id_lists = tokenize_texts(list(runtime.init_texts))
    if config.init == "centroid" and runtime.init_anchors is not None:
        anchors = runtime.init_anchors
        keys = ("token_ids", "vectors")
        if isinstance(anchors, dict):
            if any(anchors.get(k) is None for k in keys):
                raise ValueError("init_anchors must hold 'token_ids' and 'vectors'.")
            ids, vectors = (load_tensor(anchors[k], what=f"init_anchors {k}") for k in keys)
        else:
            ids, vectors = (load_tensor(anchors, what="init_anchors", key=k) for k in keys)
        data.anchor_token_ids, data.anchor_vectors = ids.long().tolist(), vectors
        if len(data.anchor_token_ids) != data.anchor_vectors.shape[0]:
            raise ValueError(
                f"init_anchors has {len(data.anchor_token_ids)} token ids but {data.anchor_vectors.shape[0]} vectors."
            )
    return data


# Vocabulary extension: add tokens to a tokenizer and a model, resize, and return the rows they own.


class AddedTokens(list):
    """Row indices of tokens added by :func:`add_tokens` (a ``list[int]``), with what a config records of them."""

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
    return hasattr(model, "peft_config") or isinstance(model.get_input_embeddings(), GroundedTokenLayer)


@torch.no_grad()
def fill_with_mean(weight: torch.Tensor, rows: list[int], reference_rows: int) -> None:
    """Set ``rows`` of ``weight`` to the mean of its first ``reference_rows`` rows (a deterministic placeholder)."""
    mean = weight[:reference_rows].double().mean(dim=0).to(weight.dtype)
    weight[torch.as_tensor(rows, device=weight.device)] = mean


def add_tokens(
    tokenizer, model: nn.Module, tokens: Sequence[str], *, pad_to_multiple_of: int | None = None
) -> AddedTokens:
    """Add ``tokens`` (none of them existing) to ``tokenizer`` and ``model``; return their rows' indices.

    Never shrinks the embedding (Qwen3's has more rows than ``len(tokenizer)``). The new rows, input and untied
    output, are set to the mean of the existing rows, so the resized base is deterministic.
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
