"""What a training step runs on: attention per sequence on padding-free rows, in float32 under a CPU's bf16
autocast (:func:`training_attention`), float32 master weights (:func:`upcast_trainable`), the item targets of a
batch (:func:`count_targets`), and the seeded sample and fingerprint of the training rows.

On a CPU, PyTorch's fused attention is several times slower backward in bf16 than in float32 (BENCHMARKS.md,
"The step against its matrix products"), while its products are a small share of a step beside the linear
layers'; and SDPA over a padding-free row computes the whole row's square under a block-diagonal mask. During
training :func:`training_attention` runs each packed sequence through SDPA on its own and, under bf16, on
float32 copies of the queries, keys and values, casting the output back: the linear layers keep bf16. Where
the products are fast (bf16 on a CPU), the MLP's and norms' elementwise passes weigh: :func:`compiled_blocks`
fuses them with ``torch.compile``.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from functools import cache, partial
from typing import Any

import torch


def packed_lengths(position_ids: torch.Tensor | None, length: int) -> list[int] | None:
    """The lengths of the sequences packed into a padding-free row (one row whose positions restart at 0, as
    TRL's ``padding_free`` collates it), or None for anything else (a padded batch, one sequence)."""
    if position_ids is None or position_ids.dim() != 2 or tuple(position_ids.shape) != (1, length):
        return None
    starts = torch.nonzero(position_ids[0] == 0).flatten().tolist()
    if len(starts) < 2 or starts[0] != 0:
        return None
    return [end - start for start, end in zip(starts, [*starts[1:], length], strict=True)]


def _training_sdpa(
    module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask, *args,
    float32: bool, per_sequence: bool, **kwargs,
):  # fmt: skip
    """SDPA, with ``per_sequence`` attending within each sequence of a padding-free row (causal, no mask)
    instead of over the whole row under a block-diagonal mask: the products of the sequences' own squares, not
    of the row's; with ``float32`` on float32 copies of q, k, v. Padded batches and a KV cache go to SDPA."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    dtype = query.dtype
    if float32:
        query, key, value = query.float(), key.float(), value.float()
    lengths = None
    if per_sequence and query.shape[2] == key.shape[2]:
        lengths = packed_lengths(kwargs.get("position_ids"), query.shape[2])
    with torch.autocast(query.device.type, enabled=False) if float32 else nullcontext():
        if lengths is None:
            output, weights = sdpa_attention_forward(
                module, query, key, value, attention_mask, *args, **kwargs
            )
        else:
            parts = zip(query.split(lengths, 2), key.split(lengths, 2), value.split(lengths, 2), strict=True)
            output = torch.cat(
                [sdpa_attention_forward(module, q, k, v, None, *args, **kwargs)[0] for q, k, v in parts],
                dim=1,
            )
            weights = None
    return output.to(dtype), weights


@cache
def attention_name(float32: bool, per_sequence: bool) -> str:
    """The registered name of the training attention (SDPA's mask builder under it too: transformers picks the
    mask by the implementation's name, and a padded batch or a row-wide packed one needs it)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    name = "sdpa" + ("_per_sequence" if per_sequence else "") + ("_float32" if float32 else "")
    function = partial(_training_sdpa, float32=float32, per_sequence=per_sequence)
    AttentionInterface.register(name, function)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


@contextmanager
def training_attention(model: Any, float32: bool = False, per_sequence: bool = True) -> Iterator[str | None]:
    """Within the block, ``model``'s SDPA attention (a PEFT model: its base model's) attends per sequence on
    padding-free rows (``per_sequence``) and, with ``float32``, runs on float32 copies of q, k, v (under a
    CPU's bf16 autocast); yields the implementation's name. A model on another attention implementation is
    left as it is (None), as is one with neither switch on."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    current = getattr(config, "_attn_implementation", None)
    if current != "sdpa" or not hasattr(base, "set_attn_implementation") or not (float32 or per_sequence):
        yield None
        return
    name = attention_name(float32, per_sequence)
    base.set_attn_implementation(name)
    try:
        yield name
    finally:
        base.set_attn_implementation(current)


def compiler_found() -> bool:
    """Whether inductor's C++ compiler (``$CXX``, else ``g++``) is on the path."""
    return shutil.which(os.environ.get("CXX") or "g++") is not None


def compiled_parts(model: Any) -> list[torch.nn.Module]:
    """The modules :func:`compiled_blocks` compiles: each decoder block's MLP and norms (no data-dependent
    shapes, unlike attention on padding-free rows)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    blocks = getattr(getattr(base, "model", base), "layers", None)
    if blocks is None:
        return []
    names = ("mlp", "input_layernorm", "post_attention_layernorm")
    return [getattr(block, n) for block in blocks for n in names if hasattr(block, n)]


def compile_problem() -> str | None:
    """Why ``torch.compile`` cannot run here (None: it can): no C++ compiler for inductor, or kernels held to
    another ISA by ``ATEN_CPU_CAPABILITY`` with inductor's shared on-disk cache, which does not key on the ISA (a
    graph compiled under AVX-512 and read back under ``avx2`` returned NaN)."""
    if not compiler_found():
        return (
            "compile_blocks needs a C++ compiler for torch.compile on a CPU (g++ or $CXX); install one "
            "(e.g. apt install g++) or train with compile_blocks=False (--compile_blocks False)"
        )
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    shared = os.environ.get("TORCHINDUCTOR_CACHE_DIR") in (None, default_cache_dir())  # torch sets it itself
    if os.environ.get("ATEN_CPU_CAPABILITY") and shared:
        return (
            "compile_blocks under ATEN_CPU_CAPABILITY would read torch.compile's shared cache, whose graphs "
            "for another ISA gave NaN: set TORCHINDUCTOR_CACHE_DIR to a folder of this ISA's own, or train "
            "with compile_blocks=False (--compile_blocks False)"
        )
    return None


@contextmanager
def compiled_blocks(model: Any, on: bool) -> Iterator[int]:
    """Within the block (``on``), :func:`compiled_parts` run through ``torch.compile`` (``nn.Module.compile``,
    dynamic shapes: their ``forward`` is left alone, which transformers' kernel hub rewrites on ``eval()``);
    yields how many; afterwards they run as before."""
    parts = compiled_parts(model) if on else []
    problem = compile_problem() if on else None
    if problem:
        raise RuntimeError(problem)
    before = [part._compiled_call_impl for part in parts]  # a part the user compiled stays compiled
    for part in parts:
        part.compile(dynamic=True)
    try:
        yield len(parts)
    finally:
        for part, call in zip(parts, before, strict=True):
            part._compiled_call_impl = call


def _to_float32(module: torch.nn.Module, args: Any, output: Any) -> Any:
    return output.float() if isinstance(output, torch.Tensor) and output.is_floating_point() else output


@contextmanager
def float32_stream(model: Any, on: bool) -> Iterator[bool]:
    """Within the block (``on``), ``model``'s input embeddings come out in float32, so that a bf16 model's
    residual stream (the sums around each block, the norms' inputs, the final hidden states) stays float32 while
    its linear layers run in bf16 under autocast; the SID-only head then scores in float32 too
    (:func:`compact_fused_forward` scores in the hidden states' dtype). Yields whether a hook is in place."""
    embeddings = model.get_input_embeddings() if on else None
    if embeddings is None:
        yield False
        return
    handle = embeddings.register_forward_hook(_to_float32)
    try:
        yield True
    finally:
        handle.remove()


# What the steps run on, decided from a stage's config (``fused_lora``, ``compile_blocks``: None decides here).


COMPILE_MIN_STEPS = 100  # compiling takes seconds: it pays back over this many steps (or a time budget)


def shards_weights(args: Any) -> bool:
    """Whether FSDP or DeepSpeed shard the model's weights: in ``args``, or as ``accelerate launch`` configured."""
    launched = any(
        os.environ.get(f"ACCELERATE_USE_{name}", "").lower() in ("1", "true")
        for name in ("FSDP", "DEEPSPEED")
    )
    return bool(getattr(args, "fsdp", None) or getattr(args, "deepspeed", None) or launched)


def wants_fused_lora(args: Any, device_type: str) -> bool:
    """``args.fused_lora``, or where None: on a CPU, in a single process. Forced on where FSDP or DeepSpeed
    shard the weights, a clear error (the stack holds a layer's whole weight)."""
    if args.fused_lora is not None:
        if args.fused_lora and shards_weights(args):
            raise ValueError(
                "fused_lora stacks each layer's whole frozen weight with its LoRA A, which FSDP and DeepSpeed "
                "shard across processes: train with fused_lora=False (--fused_lora False) or leave it to auto"
            )
        return bool(args.fused_lora)
    return device_type == "cpu" and getattr(args, "world_size", 1) == 1 and not shards_weights(args)


def wants_compile_blocks(args: Any, device_type: str) -> bool:
    """``args.compile_blocks``, or where None: on for bf16 on a CPU where ``torch.compile`` can run
    (:func:`compile_problem`), over at least ``COMPILE_MIN_STEPS`` steps or a time
    budget."""
    if args.compile_blocks is not None:
        return bool(args.compile_blocks)
    long_run = args.max_steps < 0 or args.max_steps >= COMPILE_MIN_STEPS
    return device_type == "cpu" and bool(args.bf16) and long_run and compile_problem() is None


@contextmanager
def training_kernels(model: Any, args: Any) -> Iterator[None]:
    """What the trainer's steps run on (``args``: its config): on a CPU, :func:`training_attention` (float32
    under bf16); :func:`~peft_grounded.training.fused_lora.fused_lora` and :func:`compiled_blocks` where
    :func:`wants_fused_lora` and :func:`wants_compile_blocks` say so; under bf16 with
    ``float32_stream``, :func:`float32_stream`."""
    from .fused_lora import fused_lora

    device = args.device.type
    attention = training_attention(model, float32=bool(args.bf16)) if device == "cpu" else nullcontext()
    lora = fused_lora(model, wants_fused_lora(args, device))
    stream = float32_stream(model, bool(getattr(args, "float32_stream", False)) and bool(args.bf16))
    with attention, lora, compiled_blocks(model, wants_compile_blocks(args, device)), stream:
        yield


logger = logging.getLogger(__name__)


def count_targets(labels: torch.Tensor) -> torch.Tensor:
    """``[labelled tokens, item targets]`` of a batch (a target = a run of labelled tokens: one SID)."""
    labelled = labels != -100
    starts = labelled.clone()
    starts[:, 1:] &= ~labelled[:, :-1]
    return torch.stack([labelled.sum(), starts.sum()])


def upcast_trainable(model) -> list[str]:
    """Cast every trainable half-precision parameter to float32 in place (master weights: bf16/fp16 updates
    of small adapter weights round away); returns their names. PEFT's layers cast their inputs to the
    adapter's dtype and the result back, so a half-precision base keeps running in its dtype.

    An adapter created with ``autocast_adapter_dtype=False`` (PEFT's switch for adapters in the base's dtype,
    e.g. under DeepSpeed ZeRO-3) is left as it is: rows and LoRA stay in one dtype, as asked."""
    tuner = getattr(model, "base_model", None)
    if hasattr(tuner, "adapter_autocast") and not tuner.adapter_autocast(model.active_adapter):
        logger.info(
            "autocast_adapter_dtype=False: the adapter weights train in the dtype they were created in"
        )
        return []
    cast = []
    for name, param in model.named_parameters():
        if param.requires_grad and param.dtype in (torch.float16, torch.bfloat16):
            param.data = param.data.float()
            cast.append(name)
    if cast:
        logger.info(
            "trainable weights cast to float32 (master weights): %d tensors, e.g. %s", len(cast), cast[0]
        )
    return cast
