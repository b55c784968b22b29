"""Stack a LoRA on a grounded adapter for the task's SFT: one artefact with the rows and the LoRA."""

from __future__ import annotations

from peft import PeftModel

from .config import GroundedTokenConfig


def add_lora(
    model: PeftModel,
    r: int = 16,
    lora_alpha: int = 32,
    lora_dropout: float = 0.0,
    target_modules: str | list[str] = "all-linear",
    adapter_name: str | None = None,
) -> PeftModel:
    """Add a LoRA to the grounded adapter of ``model`` in place and return ``model``.

    The new-token rows keep their grounded values and stay trainable; the LoRA starts as a no-op
    (``B = 0``). ``model.save_pretrained`` then writes one adapter holding both, which
    ``PeftModel.from_pretrained(base, path)`` restores after ``import peft_grounded``. Load a grounded
    adapter with ``is_trainable=True`` before stacking so its rows train.
    """
    name = adapter_name or model.active_adapter
    config = model.peft_config.get(name)
    if not isinstance(config, GroundedTokenConfig):
        raise TypeError(f"Adapter {name!r} is not a grounded-token adapter; add_lora stacks onto those.")
    if config.has_lora:
        raise ValueError(f"Adapter {name!r} already has a LoRA (r={config.lora_r}).")
    fields = ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules")
    before = {f: getattr(config, f) for f in fields}
    config.lora_r, config.lora_alpha, config.lora_dropout = r, lora_alpha, lora_dropout
    config.lora_target_modules = target_modules
    try:
        model.base_model.inject_lora(name)
    except Exception:
        for f, value in before.items():  # a refused LoRA leaves the config as it was
            setattr(config, f, value)
        raise
    return model
