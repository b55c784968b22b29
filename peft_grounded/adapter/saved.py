"""A saved grounded adapter read without a model (its config and rows), and the method's registration in PEFT."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from peft.utils.constants import CONFIG_NAME as ADAPTER_CONFIG
from peft.utils.constants import SAFETENSORS_WEIGHTS_NAME as ADAPTER_WEIGHTS
from peft.utils.peft_types import PeftType
from safetensors import SafetensorError
from safetensors.torch import load_file

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


FIX = "save it again, or restore a good copy (a run's adapter/ is written by its training stage)"


def adapter_files(path: str | Path) -> tuple[Path, Path]:
    """``(adapter_config.json, adapter_model.safetensors)`` of the adapter folder ``path``; a clear error
    for a missing folder, a file, a folder without them, or pickled weights only (never loaded)."""
    directory = Path(path)
    config_file, weights = directory / ADAPTER_CONFIG, directory / ADAPTER_WEIGHTS
    if not directory.exists():
        raise FileNotFoundError(f"no adapter folder {directory}: pass the folder that save_pretrained wrote")
    if not directory.is_dir():
        raise ValueError(f"{directory} is a file; pass the adapter's folder (it holds {ADAPTER_CONFIG})")
    if not config_file.is_file():
        raise FileNotFoundError(
            f"{directory} holds no {ADAPTER_CONFIG}, so it is not a saved adapter: pass the folder that "
            "save_pretrained wrote (e.g. <run>/adapter)"
        )
    if not weights.is_file():
        pickled = [p.name for p in directory.glob("*.bin")] + [p.name for p in directory.glob("*.pt")]
        extra = f" ({', '.join(pickled)} are pickles, never loaded)" if pickled else ""
        raise FileNotFoundError(f"{directory} has {ADAPTER_CONFIG} but no {ADAPTER_WEIGHTS}{extra}; {FIX}")
    return config_file, weights


def adapter_config_json(path: str | Path, fix: str = FIX) -> Any:
    """The JSON value of ``adapter_config.json`` in the adapter folder ``path`` (the package's one parser of
    that file); errors name the file and ``fix``."""
    from .._io import read_json

    return read_json(Path(path) / ADAPTER_CONFIG, fix=fix)


def read_adapter_config(path: str | Path) -> dict[str, Any]:
    """The adapter config (a dict) of the adapter folder ``path``, with errors naming the file."""
    config_file, _ = adapter_files(path)
    config = adapter_config_json(path)
    if not isinstance(config, dict):
        raise ValueError(f"{config_file} holds a JSON {type(config).__name__}, not an adapter config; {FIX}")
    if config.get("peft_type") not in (None, PEFT_TYPE):
        raise ValueError(
            f"{Path(path)} holds a {config.get('peft_type')} adapter, not a grounded-token adapter."
        )
    return config


def recorded_fact(config: dict[str, Any], key: str) -> Any:
    """A creation-time fact of a saved config (``num_embeddings``, ``embedding_signature``,
    ``vocab_fingerprint``, ``init_data``)."""
    return (config.get("provenance") or {}).get(key)


def read_adapter(path: str | Path) -> SavedAdapter:
    """Config and rows of the grounded adapter saved at ``path`` (safetensors only), checked: every tensor
    finite, the rows' shapes those the config lists."""
    directory = Path(path)
    config = read_adapter_config(directory)
    _, weights = adapter_files(directory)
    try:
        tensors = load_file(str(weights))
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise ValueError(f"{weights} cannot be read ({err}): truncated or corrupted; {FIX}") from None
    inputs = [k for k in tensors if k.endswith("grounded_embedding")]
    outputs = [k for k in tensors if k.endswith("grounded_head")]
    if len(inputs) != 1 or len(outputs) > 1:
        raise ValueError(
            f"{weights} holds {len(inputs)} grounded embeddings and {len(outputs)} heads; "
            "expected one adapter."
        )
    input_rows = tensors[inputs[0]]
    output_rows = tensors[outputs[0]] if outputs else None
    count = len(config.get("token_indices") or [])
    for name, rows in (("grounded_embedding", input_rows), ("grounded_head", output_rows)):
        if rows is None:
            continue
        if rows.ndim != 2 or (count and rows.shape[0] != count):
            raise ValueError(
                f"{weights}: {name} has shape {tuple(rows.shape)} but the config lists {count} tokens; "
                "the files come from two different saves or are corrupted."
            )
    bad = [k for k, t in tensors.items() if t.is_floating_point() and not torch.isfinite(t).all()]
    if bad:
        what = "grounded_embedding" if any(k.endswith("grounded_embedding") for k in bad) else bad[0]
        raise ValueError(f"{weights}: {what} holds NaN or Inf rows (tensors {bad[:3]}); {FIX}")
    return SavedAdapter(directory, config, input_rows, output_rows)


def adapter_rows(
    path: str | Path, token_indices: list[int], token_strings: list[str] | None, width: int | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Input and output rows for ``token_indices`` from a saved grounded adapter (warm start), matched by string
    when both adapters know their strings, else by index; ``width``, the model's, is checked."""
    saved = read_adapter(path)
    order = saved.positions(token_strings, token_indices)
    if width is not None and saved.input_rows.shape[1] != width:
        raise ValueError(
            f"init='adapter': the rows in {saved.path} are {saved.input_rows.shape[1]}-d but this model's rows "
            f"are {width}-d: the saved adapter belongs to another base model."
        )
    output = saved.output_rows[order] if saved.output_rows is not None else None
    return saved.input_rows[order], output


# Make ``GROUNDED_TOKENS`` a PEFT method: a ``PeftType`` member (PEFT's enum has no public way to grow, and
# ``register_peft_method`` needs one), PEFT's registries, and the save path. Both private uses here, and every
# other of PEFT, TRL and transformers, are listed in docs/peft_trl_limitations.md (tests/test_peft_private_uses.py).


def _extend_peft_type(member_name: str) -> PeftType:
    """Add ``member_name`` to :class:`peft.utils.peft_types.PeftType` (idempotent)."""
    if member_name in PeftType.__members__:
        return PeftType[member_name]
    member = str.__new__(PeftType, member_name)
    member._name_ = member_name
    member._value_ = member_name
    member.__objclass__ = PeftType
    member._sort_order_ = len(PeftType._member_names_)
    type.__setattr__(PeftType, member_name, member)
    PeftType._member_map_[member_name] = member
    PeftType._value2member_map_[member_name] = member
    PeftType._member_names_.append(member_name)
    return member


GROUNDED_TOKENS = _extend_peft_type(PEFT_TYPE)


def register(config_cls: type, model_cls: type) -> None:
    """Register the method with PEFT (idempotent) and keep PEFT from saving whole embedding matrices."""
    from peft.mapping import PEFT_TYPE_TO_TUNER_MAPPING
    from peft.utils import register_peft_method

    if PEFT_TYPE_TO_TUNER_MAPPING.get(GROUNDED_TOKENS) is not model_cls:
        register_peft_method(
            name=PEFT_TYPE.lower(), config_cls=config_cls, model_cls=model_cls, prefix=model_cls.prefix
        )
    _patch_embedding_save()


def _patch_embedding_save() -> None:
    """Resolve ``save_embedding_layers="auto"`` to False for grounded adapters: PEFT's "auto" (``Trainer``'s and
    ``push_to_hub``'s) saves the whole resized embedding, while the adapter holds every row that differs from the
    base. An explicit ``save_embedding_layers=True`` is honoured."""
    import peft
    import peft.peft_model
    import peft.utils
    import peft.utils.save_and_load as save_and_load

    original = save_and_load.get_peft_model_state_dict
    if getattr(original, "_grounded_patch", False):
        return

    @functools.wraps(original)
    def get_peft_model_state_dict(
        model, state_dict=None, adapter_name="default", unwrap_compiled=False, save_embedding_layers="auto"
    ):
        config = model.peft_config[adapter_name]
        if save_embedding_layers == "auto" and config.peft_type == GROUNDED_TOKENS:
            save_embedding_layers = False
        return original(
            model,
            state_dict=state_dict,
            adapter_name=adapter_name,
            unwrap_compiled=unwrap_compiled,
            save_embedding_layers=save_embedding_layers,
        )

    get_peft_model_state_dict._grounded_patch = True
    for module in (save_and_load, peft.utils, peft.peft_model, peft):
        if getattr(module, "get_peft_model_state_dict", None) is original:
            module.get_peft_model_state_dict = get_peft_model_state_dict
