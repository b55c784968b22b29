"""The LoRA stacked on a grounded adapter for the task's SFT: its settings, checked, and :func:`add_lora`."""

from __future__ import annotations

import inspect
from typing import Any

from peft import LoraConfig, PeftModel

from .. import checks
from .saved import GROUNDED_TOKENS

# LoraConfig options the grounded adapter sets itself, or does not support on its stacked LoRA (extra trainable
# weights, data-driven initialisations that rewrite the frozen backbone, runtime objects that are not JSON).
LORA_OPTIONS_REFUSED = (
    "peft_type",
    "task_type",
    "inference_mode",
    "base_model_name_or_path",
    "revision",
    "modules_to_save",
    "trainable_token_indices",
    "target_parameters",
    "layer_replication",
    "runtime_config",
    "loftq_config",
    "eva_config",
    "corda_config",
    "megatron_config",
)
LORA_INITS = (True, False, "gaussian")


def checked_lora(lora: Any) -> dict[str, Any] | None:
    """``lora`` as a JSON-ready dict of ``peft.LoraConfig`` keyword arguments, checked; None stays None."""
    if lora is None:
        return None
    if isinstance(lora, LoraConfig):
        raise TypeError(
            "lora takes LoraConfig keyword arguments as a dict (e.g. {'r': 16, 'target_modules': ...})."
        )
    if not isinstance(lora, dict):
        raise TypeError(
            f"lora must be a dict of peft.LoraConfig keyword arguments or None, got {type(lora).__name__}."
        )
    unknown = sorted(set(lora) - set(inspect.signature(LoraConfig).parameters))
    if unknown:
        raise ValueError(f"lora has keys that peft.LoraConfig does not take: {unknown}.")
    refused = sorted(k for k in lora if k in LORA_OPTIONS_REFUSED and lora[k] is not None)
    if lora.get("bias", "none") != "none":
        refused.append("bias")
    if lora.get("init_lora_weights", True) not in LORA_INITS:
        refused.append("init_lora_weights")
    if refused:
        raise ValueError(
            f"lora sets {refused}, which the grounded adapter does not support on its stacked LoRA: task type and mode "
            "come from the adapter, the new rows are its only other trainable weights, the backbone stays as loaded "
            f"(init_lora_weights: one of {LORA_INITS}), and the config is saved as JSON."
        )
    if not lora.get("target_modules"):
        raise ValueError("lora needs target_modules (e.g. 'all-linear' or ['q_proj', 'v_proj']).")
    checks.raise_problems(
        "lora",
        [
            checks.int_at_least("r", lora.get("r", 8), 1, flag="--lora-r"),
            checks.number_in("lora_alpha", lora.get("lora_alpha", 8), 0, low_open=True, flag="--lora-alpha"),
            checks.number_in(
                "lora_dropout", lora.get("lora_dropout", 0.0), 0, 1, high_open=True, flag="--lora-dropout"
            ),
        ],
    )
    out = dict(lora)
    if isinstance(out["target_modules"], (set, frozenset, tuple)):
        out["target_modules"] = sorted(out["target_modules"])
    LoraConfig(**out)  # LoraConfig's own checks now, not at injection
    return out


def lora_settings(
    r: int = 16,
    lora_alpha: int = 32,
    lora_dropout: float = 0.0,
    target_modules: str | list[str] = "all-linear",
    **lora_kwargs: Any,
) -> dict[str, Any]:
    """:func:`add_lora`'s arguments as the checked ``LoraConfig`` keyword arguments it records (raises on a
    value out of range, so an entry point can check them before loading a model)."""
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
    """Add a LoRA (``peft.LoraConfig`` arguments, recorded in the config's ``lora``) to the grounded adapter of
    ``model`` in place and return ``model``.

    The new rows keep their values and stay trainable; the LoRA starts as a no-op (``B = 0``), and
    ``save_pretrained`` writes one adapter holding both. Load a grounded adapter with ``is_trainable=True``
    before stacking so its rows train. ``A``'s random start is drawn from torch's generator, as PEFT's; the
    training entry points draw it from the run's seed (:func:`peft_grounded.training.trainer.seeded`).
    """
    name = adapter_name or model.active_adapter
    config = model.peft_config.get(name)
    if getattr(config, "peft_type", None) != GROUNDED_TOKENS:
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
