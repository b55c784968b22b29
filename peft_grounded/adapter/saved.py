"""Reading a saved grounded adapter without a model: its config and its new-token rows."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from peft.utils.constants import CONFIG_NAME as ADAPTER_CONFIG
from peft.utils.constants import SAFETENSORS_WEIGHTS_NAME as ADAPTER_WEIGHTS

PEFT_TYPE = "GROUNDED_TOKENS"  # the method's name in PEFT's registry and in every adapter_config.json


@dataclass
class SavedAdapter:
    """A saved grounded adapter: its config (as a dict) and its rows, in the order of ``token_strings``."""

    path: Path
    config: dict[str, Any]
    input_rows: torch.Tensor
    output_rows: torch.Tensor | None  # untied heads only

    @property
    def token_strings(self) -> list[str] | None:
        strings = self.config.get("token_strings")
        return list(strings) if strings else None

    @property
    def token_indices(self) -> list[int]:
        return [int(i) for i in self.config.get("token_indices") or []]

    def positions(self, tokens: list[str] | None = None, indices: list[int] | None = None) -> torch.Tensor:
        """Row positions of ``tokens`` (by string, when the adapter records its strings) or ``indices``."""
        if tokens is not None and self.token_strings is not None:
            where = {s: i for i, s in enumerate(self.token_strings)}
            missing = [s for s in tokens if s not in where]
            wanted = tokens
        else:
            where = {t: i for i, t in enumerate(self.token_indices)}
            wanted = list(indices if indices is not None else [])
            missing = [t for t in wanted if t not in where]
        if missing:
            raise ValueError(f"{self.path} does not hold the tokens {missing[:5]}.")
        return torch.as_tensor([where[t] for t in wanted], dtype=torch.long)


def read_adapter(path: str | Path) -> SavedAdapter:
    """Config and rows of the grounded adapter saved at ``path`` (safetensors only); clear errors otherwise."""
    from safetensors import safe_open

    directory = Path(path)
    config_file, weights = directory / ADAPTER_CONFIG, directory / ADAPTER_WEIGHTS
    if not config_file.is_file() or not weights.is_file():
        raise FileNotFoundError(
            f"{directory} does not hold a saved adapter ({ADAPTER_CONFIG} + {ADAPTER_WEIGHTS})."
        )
    config = json.loads(config_file.read_text())
    if config.get("peft_type") not in (None, PEFT_TYPE):
        raise ValueError(
            f"{directory} holds a {config.get('peft_type')} adapter, not a grounded-token adapter."
        )
    with safe_open(str(weights), framework="pt") as handle:
        keys = list(handle.keys())
        inputs = [k for k in keys if k.endswith("grounded_embedding")]
        outputs = [k for k in keys if k.endswith("grounded_head")]
        if len(inputs) != 1 or len(outputs) > 1:
            raise ValueError(
                f"{weights} holds {len(inputs)} grounded embeddings and {len(outputs)} heads; "
                "expected one adapter."
            )
        input_rows = handle.get_tensor(inputs[0])
        output_rows = handle.get_tensor(outputs[0]) if outputs else None
    count = len(config.get("token_indices") or [])
    for name, rows in (("grounded_embedding", input_rows), ("grounded_head", output_rows)):
        if rows is None:
            continue
        if rows.ndim != 2 or (count and rows.shape[0] != count):
            raise ValueError(
                f"{weights}: {name} has shape {tuple(rows.shape)} but the config lists {count} tokens; "
                "the files come from two different saves or are corrupted."
            )
        if not torch.isfinite(rows).all():
            raise ValueError(f"{weights}: {name} holds NaN or Inf rows.")
    return SavedAdapter(directory, config, input_rows, output_rows)


def adapter_rows(
    path: str | Path, token_indices: list[int], token_strings: list[str] | None, width: int | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Input and output rows for ``token_indices`` taken from a saved grounded adapter (warm start).

    Tokens are matched by string when both adapters know their strings, else by index. ``width``: the
    model's row width, checked so that another model's adapter fails here, clearly.
    """
    saved = read_adapter(path)
    order = saved.positions(token_strings, token_indices)
    if width is not None and saved.input_rows.shape[1] != width:
        raise ValueError(
            f"init='adapter': the rows in {saved.path} are {saved.input_rows.shape[1]}-d but this model's rows "
            f"are {width}-d: the saved adapter belongs to another base model."
        )
    output = saved.output_rows[order] if saved.output_rows is not None else None
    return saved.input_rows[order], output
