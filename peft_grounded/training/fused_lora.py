"""LoRA layers as one stacked product while training.

PEFT's vanilla LoRA layer runs, under autocast, as about ten small kernels forward (casts of the input and of
both factors, two rank-``r`` products, a scale and a sum) and as many backward, beside the frozen layer's one
product. Where the frozen products are fast (bf16 on a CPU with AMX) those small kernels weigh as much as the
products. :func:`fused_lora` stacks each layer's frozen weight ``W`` and LoRA ``A`` into one matrix ``[W; A]``
(the weight becomes a view of it, so no memory is added): one product reads the input once for the base output
and the down-projection, and the up-projection is added into the base output (``addmm``). Backward reads the
output gradient once for the input gradient, through the same stack. ``A`` and ``B`` keep their float32
master weights; the stack holds ``A`` in the compute dtype, copied in at every forward.

A layer the stack cannot express keeps PEFT's forward (:func:`unfusable`): a LoRA variant (DoRA, ...), dropout,
several active adapters, a trainable, quantised or transposed base.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

logger = logging.getLogger(__name__)


class _StackedLoraProduct(torch.autograd.Function):
    """``x @ W.T + (x @ A.T) @ (scaling * B).T`` through ``stacked = [W; A]``; gradients for ``x``, ``A`` and
    ``B`` (the frozen ``W`` gets none)."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        stacked: torch.Tensor,
        lora_a: torch.Tensor,
        lora_b: torch.Tensor,
        scaling: float,
        bias: torch.Tensor | None,
    ) -> torch.Tensor:
        out = stacked.shape[0] - lora_a.shape[0]
        flat = x.reshape(-1, x.shape[-1])
        both = flat @ stacked.t()  # [base output | down-projection]
        down = both[:, out:].contiguous()
        up = (lora_b * scaling).to(stacked.dtype)
        result = torch.addmm(both[:, :out], down, up.t())
        if bias is not None:
            result += bias.to(result.dtype)
        ctx.save_for_backward(flat, stacked, down, up)
        ctx.input_shape = x.shape
        ctx.scaling = scaling
        ctx.dtypes = (lora_a.dtype, lora_b.dtype)
        return result.view(*x.shape[:-1], out)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        flat, stacked, down, up = ctx.saved_tensors
        grad = grad.reshape(-1, grad.shape[-1]).to(stacked.dtype)
        grad_down = grad @ up
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = (torch.cat([grad, grad_down], dim=1) @ stacked).view(*ctx.input_shape)
        dtype_a, dtype_b = ctx.dtypes
        grad_a = (grad_down.t() @ flat).to(dtype_a)
        grad_b = (grad.t() @ down).mul_(ctx.scaling).to(dtype_b)
        return grad_x, None, grad_a, grad_b, None, None


def unfusable(layer: nn.Module) -> str | None:
    """Why a PEFT LoRA layer cannot run as one stacked product (None: it can)."""
    from peft.tuners.lora import Linear as LoraLinear

    if type(layer) is not LoraLinear:
        return f"{type(layer).__name__} is not PEFT's plain LoRA Linear"
    base = layer.get_base_layer()
    if type(base) is not nn.Linear:
        return f"its base is a {type(base).__name__}, not an nn.Linear"
    if getattr(layer, "fan_in_fan_out", False):
        return "fan_in_fan_out"
    if base.weight.requires_grad or (base.bias is not None and base.bias.requires_grad):
        return "its base weights train"
    active = _active(layer)
    if len(active) != 1:
        return "several active adapters" if active else "no active adapter"
    name = active[0]
    if name in getattr(layer, "lora_variant", {}):
        return f"a LoRA variant ({type(layer.lora_variant[name]).__name__})"
    if not isinstance(layer.lora_dropout[name], nn.Identity):
        return "LoRA dropout (the down-projection reads a dropped-out input)"
    if layer.merged or layer.disable_adapters:
        return "merged or disabled"
    if layer.lora_A[name].bias is not None or layer.lora_B[name].bias is not None:
        return "LoRA with biases"
    return None


def _active(layer: nn.Module) -> list[str]:
    """The active adapters this layer has a LoRA for (PEFT's forward skips the others)."""
    return [name for name in layer.active_adapters if name in layer.lora_A]


def lora_layers(model: nn.Module) -> list[nn.Module]:
    """Every PEFT LoRA layer of ``model`` (plain Linear ones and others)."""
    from peft.tuners.lora import LoraLayer

    return [module for module in model.modules() if isinstance(module, LoraLayer)]


class _Stack:
    """One layer's ``[W; A]``: its base weight is a view of the top rows while the stack is in place."""

    def __init__(self, layer: nn.Module):
        self.layer = layer
        self.name = _active(layer)[0]
        base = layer.get_base_layer()
        self.weight = base.weight
        self.lora_a = layer.lora_A[self.name].weight
        self.lora_b = layer.lora_B[self.name].weight
        self.scaling = float(layer.scaling[self.name])
        out, rank = self.weight.shape[0], self.lora_a.shape[0]
        stacked = torch.empty(
            out + rank, self.weight.shape[1], dtype=self.weight.dtype, device=self.weight.device
        )
        stacked[:out].copy_(self.weight.data)
        self.weight.data = stacked[:out]
        self.stacked = stacked

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        layer = self.layer
        if args or kwargs or layer.merged or layer.disable_adapters or _active(layer) != [self.name]:
            return type(layer).forward(layer, x, *args, **kwargs)
        dtype = self.stacked.dtype
        if torch.is_autocast_enabled(x.device.type):
            dtype = torch.get_autocast_dtype(x.device.type)
        if dtype != self.stacked.dtype:  # autocast to another dtype than the weights': PEFT's path
            return type(layer).forward(layer, x, *args, **kwargs)
        with torch.no_grad():  # the current A (master weights) into the stack's bottom rows
            self.stacked[self.weight.shape[0] :].copy_(self.lora_a)
        bias = layer.get_base_layer().bias
        with torch.autocast(x.device.type, enabled=False):
            return _StackedLoraProduct.apply(
                x.to(dtype), self.stacked, self.lora_a, self.lora_b, self.scaling, bias
            )

    def restore(self) -> None:
        """The base weight in its own storage again; the layer's forward back to PEFT's."""
        self.weight.data = self.stacked[: self.weight.shape[0]].clone()
        del self.layer.forward


@contextmanager
def fused_lora(model: nn.Module, on: bool) -> Iterator[int]:
    """Within the block (``on``), every LoRA layer that :func:`unfusable` accepts runs as one stacked product;
    yields how many. Afterwards the layers and their base weights are as before."""
    stacks: list[_Stack] = []
    if on:
        skipped: dict[str, int] = {}
        for layer in lora_layers(model):
            reason = unfusable(layer)
            if reason is None:
                stacks.append(_Stack(layer))
            else:
                skipped[reason] = skipped.get(reason, 0) + 1
        for reason, count in skipped.items():
            logger.info("fused_lora: %d LoRA layers keep PEFT's forward (%s)", count, reason)
    for stack in stacks:
        stack.layer.forward = stack.forward
    try:
        yield len(stacks)
    finally:
        for stack in stacks:
            stack.restore()
