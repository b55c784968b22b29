"""TRL's ``ModelConfig`` with this package's defaults: the base model and the stacked LoRA of ``ground``/``sft``.

Kept apart from :mod:`.common` so that the command list does not import TRL.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trl import ModelConfig

from .common import csv_list


@dataclass
class GroundedModelConfig(ModelConfig):
    """TRL's ``ModelConfig`` with this package's defaults: the base model (``--model_name_or_path``), the dtype
    of its frozen weights (``--dtype``) and, for ``sft``, the stacked LoRA (``--lora_r``, ...)."""

    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Local base model directory; None: the packaged SmolLM2-135M."},
    )
    dtype: str | None = field(
        default="float32",
        metadata={
            "help": "dtype of the frozen base's weights (adapter weights always train in float32).",
            "choices": ["float32", "bfloat16", "float16"],
        },
    )
    layers: int = field(
        default=0,
        metadata={
            "help": "Keep the base's first N decoder blocks (0: all): a shallower base written once to "
            "OUTPUT_DIR/base-N-blocks and recorded as the adapter's base; a CPU step costs about N / total."
        },
    )
    lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout."})
    lora_target_modules: list[str] | None = field(
        default_factory=lambda: ["all-linear"],
        metadata={
            "help": "LoRA target modules: all-linear, or module names (spaces or commas between them)."
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        targets = csv_list(self.lora_target_modules)  # q_proj v_proj, q_proj,v_proj or both
        self.lora_target_modules = targets[0] if len(targets) == 1 else targets or None
        unsupported = {
            "model_revision": "main",
            "attn_implementation": None,
            "lora_task_type": "CAUSAL_LM",
            "load_in_8bit": False,
            "load_in_4bit": False,
        }
        if isinstance(self.layers, bool) or not isinstance(self.layers, int) or self.layers < 0:
            raise ValueError(
                f"layers={self.layers!r}: keep the base's first N >= 1 decoder blocks, or 0 for all"
            )
        given = [name for name, default in unsupported.items() if getattr(self, name) != default]
        if given:
            raise ValueError(
                f"{', '.join(given)}: not supported by peft-grounded (a local base model in float32, bfloat16 "
                "or float16, no quantisation); leave them out"
            )

    def model_path(self, output_dir: str | Path) -> str | None:
        """The base to load: ``model_name_or_path`` (None: the packaged SmolLM2), cut to its first ``layers``
        blocks in ``output_dir/base-N-blocks`` when ``layers`` is set (written once)."""
        if not self.layers:
            return self.model_name_or_path
        from .. import assets
        from ..training.sft.recommendation_trainer import shallow_base

        source = self.model_name_or_path or assets.smollm2()
        return str(shallow_base(source, self.layers, Path(output_dir) / f"base-{self.layers}-blocks"))

    def torch_dtype(self) -> Any:
        """The frozen base's ``torch.dtype``."""
        import torch

        return getattr(torch, self.dtype or "float32")

    def lora(self) -> dict[str, Any]:
        """The stacked LoRA as ``peft.LoraConfig`` keyword arguments (what ``add_lora`` takes)."""
        targets: str | list[str] = csv_list(self.lora_target_modules) or ["all-linear"]
        if targets == ["all-linear"]:
            targets = "all-linear"
        out: dict[str, Any] = dict(
            r=self.lora_r, lora_alpha=self.lora_alpha, lora_dropout=self.lora_dropout, target_modules=targets
        )
        if self.use_rslora:
            out["use_rslora"] = True
        if self.use_dora:
            out["use_dora"] = True
        if self.lora_target_parameters:
            out["target_parameters"] = csv_list(self.lora_target_parameters)
        if self.lora_modules_to_save:
            out["modules_to_save"] = csv_list(self.lora_modules_to_save)
        return out


@dataclass
class LoraModelConfig(GroundedModelConfig):
    """:class:`GroundedModelConfig` for ``sft``, which always stacks a LoRA on the new rows."""

    use_peft: bool = field(default=True, metadata={"help": "Stack a LoRA (sft always does)."})

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.use_peft:
            raise ValueError("sft always stacks a LoRA on the new rows: leave out --no_use_peft")
