"""The stacked LoRA's settings as ``GroundedTokenConfig.lora`` records them: ``peft.LoraConfig`` keyword
arguments, checked against what a grounded adapter supports."""

from __future__ import annotations

import inspect
from typing import Any

from peft import LoraConfig

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
    allowed = set(inspect.signature(LoraConfig).parameters)
    unknown = sorted(set(lora) - allowed)
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
    from .. import checks

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
    LoraConfig(**out)  # LoraConfig's own checks (r > 0, dropout range, ...) now, not at injection
    return out
