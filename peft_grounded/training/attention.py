"""Attention in float32 under a CPU's bf16 autocast.

On a CPU, PyTorch's fused attention is several times slower backward in bf16 than in float32 (BENCHMARKS.md,
"The step against its matrix products"), while its products are a small share of a step beside the linear
layers'. :func:`float32_attention` runs a model's SDPA attention on float32 copies of the queries, keys and
values for the duration of a block, and casts the output back: the linear layers keep bf16, attention gets
both the faster kernel and float32's precision.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

FLOAT32_SDPA = "sdpa_float32"


def _float32_sdpa(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    with torch.autocast(query.device.type, enabled=False):
        output, weights = sdpa_attention_forward(
            module, query.float(), key.float(), value.float(), *args, **kwargs
        )
    return output.to(query.dtype), weights


def _register() -> None:
    """Register the function, and SDPA's mask builder under its name: transformers picks the mask by the
    implementation's name, and without it a padding-free batch's rows would attend to each other."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(FLOAT32_SDPA, _float32_sdpa)  # idempotent
    AttentionMaskInterface.register(FLOAT32_SDPA, sdpa_mask)


@contextmanager
def float32_attention(model: Any, enabled: bool = True) -> Iterator[bool]:
    """Within the block, ``model``'s SDPA attention runs in float32 (a PEFT model: its base model's); yields
    whether it does. A model on another attention implementation, or ``enabled=False``, is left as it is."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    current = getattr(config, "_attn_implementation", None)
    if not enabled or current != "sdpa" or not hasattr(base, "set_attn_implementation"):
        yield False
        return
    _register()
    base.set_attn_implementation(FLOAT32_SDPA)
    try:
        yield True
    finally:
        base.set_attn_implementation(current)
