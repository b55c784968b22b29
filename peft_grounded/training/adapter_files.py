"""A stage's adapter on disk: written atomically (a temporary sibling folder swapped in), read back into a live
adapter of the same structure."""

from __future__ import annotations

import shutil
from pathlib import Path

from peft import PeftModel

from .._io import DiskFullError, is_disk_full, make_temp_dir, swap_dir_into_place
from ..adapter.saved import ADAPTER_WEIGHTS
from ..sids.model import save_sid_record


def save_adapter_atomic(model: PeftModel, directory: str | Path, state_dict: dict | None = None) -> Path:
    """``model.save_pretrained(directory)`` and its SID record through a temporary sibling directory, swapped in
    at the end (``state_dict``: the weights to take them from, e.g. gathered from shards)."""
    directory = Path(directory)
    tmp = make_temp_dir(directory)
    try:
        model.save_pretrained(tmp, **({} if state_dict is None else {"state_dict": state_dict}))
        save_sid_record(model, tmp)
        swap_dir_into_place(tmp, directory)
    except Exception as err:
        if is_disk_full(err):
            raise DiskFullError(
                f"no space to write the adapter {directory} ({err}); "
                + ("the previous one was left as it was" if directory.exists() else "nothing was written")
                + ". Free disk space, then run the command again",
                err,
            ) from err
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return directory


def load_adapter_weights(model, directory: str | Path) -> None:
    """Load the weights a saved adapter (or a checkpoint) holds into the live adapter of the same structure."""
    from peft.utils import set_peft_model_state_dict
    from safetensors.torch import load_file

    directory = Path(directory)
    state = load_file(str(directory / ADAPTER_WEIGHTS))
    adapter = getattr(model, "active_adapter", "default")
    result = set_peft_model_state_dict(model, state, adapter_name=adapter)
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise ValueError(f"{directory} does not fit this adapter (unexpected keys {unexpected[:3]}).")
