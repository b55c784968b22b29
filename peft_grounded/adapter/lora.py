"""Stack a LoRA on a grounded adapter for the task's SFT: one artefact with the rows and the LoRA."""

from __future__ import annotations

from typing import Any

from peft import PeftModel

from .config import GroundedTokenConfig
from .lora_settings import checked_lora


def lora_settings(
    r: int = 16,
    lora_alpha: int = 32,
    lora_dropout: float = 0.0,
    target_modules: str | list[str] = "all-linear",
    **lora_kwargs: Any,
) -> dict[str, Any]:
    """:func:`add_lora`'s arguments as the checked ``peft.LoraConfig`` keyword arguments it records; raises
    on a value out of range, so an entry point can check them before loading a model."""
    lora = {"r": r, "lora_alpha": lora_alpha, "lora_dropout": lora_dropout, "target_modules": target_modules}
    return checked_lora(lora | lora_kwargs)


def add_lora(
    model: PeftModel,
    r: int = 16,
    lora_alpha: int = 32,
    lora_dropout: float = 0.0,
    target_modules: str | list[str] = "all-linear",
    adapter_name: str | None = None,
    **lora_kwargs: Any,
) -> PeftModel:
    """Add a LoRA to the grounded adapter of ``model`` in place and return ``model``.

    ``r``, ``lora_alpha``, ``lora_dropout``, ``target_modules`` and any other ``lora_kwargs`` are
    ``peft.LoraConfig`` arguments; they are recorded in the adapter config's ``lora``. The new-token rows
    keep their grounded values and stay trainable; the LoRA starts as a no-op (``B = 0``).
    ``model.save_pretrained`` then writes one adapter holding both, which ``PeftModel.from_pretrained(base,
    path)`` restores after ``import peft_grounded``. Load a grounded adapter with ``is_trainable=True`` before
    stacking so its rows train.
    """
    name = adapter_name or model.active_adapter
    config = model.peft_config.get(name)
    if not isinstance(config, GroundedTokenConfig):
        raise TypeError(f"Adapter {name!r} is not a grounded-token adapter; add_lora stacks onto those.")
    if config.has_lora:
        raise ValueError(f"Adapter {name!r} already has a LoRA ({config.lora}).")
    config.lora = lora_settings(r, lora_alpha, lora_dropout, target_modules, **lora_kwargs)
    try:
        model.base_model.inject_lora(name)
    except Exception:
        config.lora = None  # a refused LoRA leaves the config as it was
        raise
    return model
