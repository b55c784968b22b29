"""The base model's vocabulary rows and token strings: the text tokens of the heatmap and the nearest-token table.

From a local checkpoint, only the embedding (or head) tensor is read, and only its first ``n_rows``
rows, through a safetensors slice, instead of building the whole model. Other checkpoints (``.bin`` files,
Hub ids in the local cache) go through ``transformers``, and a model object in memory is used as it is.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from huggingface_hub.constants import SAFETENSORS_INDEX_FILE as SAFETENSORS_INDEX
from huggingface_hub.constants import SAFETENSORS_SINGLE_FILE as SAFETENSORS

# Tensor names of the input embedding and the output head in common architectures (suffixes).
INPUT_KEYS = (
    "embed_tokens.weight",
    "wte.weight",
    "word_embeddings.weight",
    "embed_in.weight",
    "tok_embeddings.weight",
)
OUTPUT_KEYS = ("lm_head.weight", "embed_out.weight", "output.weight")


@dataclass
class Vocabulary:
    """Rows ``0 .. n-1`` of a base model's input embedding (or head), with their token strings."""

    rows: Any  # torch.Tensor [n, width], float32
    tokens: list[str] | None  # tokenizer.convert_ids_to_tokens(range(n)); None without a tokenizer
    special_ids: list[int]  # kept out of the nearest-token search and the heatmap sample
    source: str  # where the rows came from, for the report
    notes: list[str] = field(default_factory=list)

    @property
    def size(self) -> int:
        return int(self.rows.shape[0])


def _find_key(keys: list[str], suffixes: tuple[str, ...]) -> str | None:
    for suffix in suffixes:
        matches = sorted(k for k in keys if k == suffix or k.endswith("." + suffix))
        if matches:
            return min(matches, key=len)
    return None


def _safetensors_rows(directory: Path, matrix: str, n_rows: int | None) -> tuple[Any, str] | None:
    """``(rows, tensor name)`` read straight from a local safetensors checkpoint, or None if it has none."""
    from safetensors import safe_open

    if (directory / SAFETENSORS_INDEX).is_file():
        from .._io import read_json

        weight_map: dict[str, str] = read_json(directory / SAFETENSORS_INDEX)["weight_map"]
    elif (directory / SAFETENSORS).is_file():
        with safe_open(str(directory / SAFETENSORS), framework="pt") as handle:
            weight_map = dict.fromkeys(handle.keys(), SAFETENSORS)
    else:
        return None
    keys = list(weight_map)
    key = _find_key(keys, OUTPUT_KEYS) if matrix == "output" else None
    key = key or _find_key(keys, INPUT_KEYS)  # a tied head has no tensor of its own
    if key is None:
        return None
    with safe_open(str(directory / weight_map[key]), framework="pt") as handle:
        part = handle.get_slice(key)
        total = part.get_shape()[0]
        rows = part[: total if n_rows is None else min(n_rows, total)]
    return rows.float(), key


def _module_rows(model: Any, matrix: str) -> Any:
    layer = model.get_output_embeddings() if matrix == "output" else None
    layer = layer if layer is not None else model.get_input_embeddings()
    base = layer.get_base_layer() if hasattr(layer, "get_base_layer") else layer  # a PEFT-wrapped layer
    return base.weight.detach()


def load_vocabulary(
    base_model: Any,
    n_rows: int | None = None,
    *,
    matrix: str = "input",
    tokenizer: Any = None,
) -> Vocabulary:
    """The first ``n_rows`` rows (default: all) of a base model's input embedding (``matrix="output"``:
    its head), as float32, and their token strings.

    ``base_model``: a local checkpoint directory, a Hub id in the local cache, or a model object
    (a PEFT-wrapped one too: its frozen base rows are used). ``tokenizer`` (default: the checkpoint's
    own, when it has one) decodes the ids and names the special tokens.
    """
    if matrix not in ("input", "output"):
        raise ValueError(f"matrix must be 'input' or 'output', got {matrix!r}")
    notes: list[str] = []
    path: Path | None = None
    if isinstance(base_model, (str, os.PathLike)):
        path = Path(base_model)
        found = _safetensors_rows(path, matrix, n_rows) if path.is_dir() else None
        if found is not None:
            rows, key = found
            source = f"{path} ({key})"
        else:
            rows, source = _transformers_rows(str(base_model), matrix), f"{base_model} (transformers)"
    else:
        rows = _module_rows(base_model, matrix).float()
        source = f"model object {type(base_model).__name__}"
        origin = getattr(base_model, "name_or_path", None)  # its tokenizer may sit next to its weights
        path = Path(origin) if origin and Path(origin).is_dir() else None
    if n_rows is not None:
        if rows.shape[0] < n_rows:
            raise ValueError(
                f"the base model {source} has {rows.shape[0]} vocabulary rows but the adapter extends a "
                f"vocabulary of {n_rows}: not the adapter's base model"
            )
        rows = rows[:n_rows]
    tokens, special = _token_strings(tokenizer, path, rows.shape[0], notes)
    return Vocabulary(rows.contiguous(), tokens, special, source, notes)


def _transformers_rows(name: str, matrix: str) -> Any:
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(name, use_safetensors=True)
    except (OSError, ValueError) as err:
        raise FileNotFoundError(
            f"cannot load the base model {name!r} ({err}); pass base_model= (--model_name_or_path) with a "
            "local checkpoint directory"
        ) from None
    return _module_rows(model, matrix).float()


def _token_strings(
    tokenizer: Any, path: Path | None, n: int, notes: list[str]
) -> tuple[list[str] | None, list[int]]:
    if tokenizer is None and path is not None:
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(str(path))
        except (OSError, ValueError) as err:
            notes.append(f"no tokenizer at {path} ({type(err).__name__}): vocabulary tokens are shown as ids")
    if tokenizer is None:
        return None, []
    decoded = tokenizer.convert_ids_to_tokens(list(range(min(n, len(tokenizer)))))
    tokens = [f"#{i}" if t is None else str(t) for i, t in enumerate(decoded)]
    tokens += [f"#{i}" for i in range(len(tokens), n)]  # rows past the tokenizer (Qwen3 padding rows)
    special = sorted({int(i) for i in tokenizer.all_special_ids if 0 <= int(i) < n})
    return tokens, special
