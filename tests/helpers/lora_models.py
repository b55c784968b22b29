"""Tiny models with a stacked LoRA whose factors are "trained" (B off zero), so that every factor has a
gradient."""

from __future__ import annotations

import torch


def nudged(model: torch.nn.Module, seed: int = 1, scale: float = 0.1) -> torch.nn.Module:
    """``model`` with every trainable parameter moved by seeded noise (LoRA B off zero), in train mode."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(scale * torch.randn(p.shape, generator=generator))
    return model.train()


def lora_model(model: torch.nn.Module, target_modules: str | list[str] = "all-linear", **lora: object):
    """``model`` under PEFT's LoRA (rank 2 unless ``lora`` says otherwise), :func:`nudged`."""
    from peft import LoraConfig, get_peft_model

    return nudged(get_peft_model(model, LoraConfig(**({"r": 2, "target_modules": target_modules} | lora))))
