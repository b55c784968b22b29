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
from dataclasses import dataclass
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


@contextmanager
def training_kernels(model: Any, args: Any) -> Iterator[None]:
    """What the trainer's steps run on (``args``: its config): on a CPU, :func:`training_attention` (float32
    under bf16); :func:`~peft_grounded.training.fused_lora.fused_lora` and :func:`compiled_blocks` where
    :func:`~peft_grounded.training.config.wants_fused_lora` and ``wants_compile_blocks`` say so; under bf16 with
    ``float32_stream``, :func:`float32_stream`."""
    from .config import wants_compile_blocks, wants_fused_lora
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


# TRL's fused LM head, scoring only the labelled positions, on every device.
#
# TRL 1.16's ``SFTTrainer`` calls ``model(..., fused_lm_head=True)`` and reads per-token log-probabilities
# from a ``FusedCausalLMOutput``. On CUDA it projects only the positions whose label is not ``-100``; on
# other devices it projects every position through the whole vocabulary and back-propagates a full
# ``vocab x d`` weight gradient. With a completion-only loss (a SID of 4 tokens after a prompt of 60) that
# is mostly wasted work (BENCHMARKS.md, "SID-only softmax: step time and decoding").
#
# :func:`compact_fused_forward` returns the same output object, computed from the labelled positions only,
# through the model's own head (so the grounded rows get their gradient as usual). The trainers of this
# package install it around TRL's ``compute_loss`` with :func:`compact_head`; models with logit soft-capping or
# scaling, pre-shifted labels, and MoE forwards asked for router logits (whose load-balancing loss TRL reads from
# the output) keep TRL's own path. The loss lives here, on the trainer's side: the adapter's forward is PEFT's.
#
# With ``sid_ids`` (``RecommendationConfig.sid_softmax_loss``) it is also the SID-only softmax: a SID target's
# logits are ``hidden @ W[sid_ids].T``, normalised over the SID rows only (:func:`head_rows` reads just those
# rows of the head, the grounded ones from the adapter), so a step never projects onto the text vocabulary.
# With ``sid_targets`` as well it returns the SID-only log-probabilities of given token ids at each SID target
# (:func:`sid_fused_output`), from which a trainer builds a soft-target loss (distillation).


@cache
def sid_fused_output() -> type:
    """``SIDFusedOutput``: TRL's ``FusedCausalLMOutput`` plus, for the ``sid_targets`` asked for,
    ``sid_log_probs`` ``[N, k]`` (the SID-only log-probabilities of those ids at the ``N`` SID targets, row-major)
    and ``sid_mask`` (where those targets are, the shape of ``log_probs``). Made on first use, so that the
    adapter imports without TRL."""
    from trl.trainer.utils import FusedCausalLMOutput

    @dataclass
    class SIDFusedOutput(FusedCausalLMOutput):
        sid_log_probs: torch.Tensor | None = None
        sid_mask: torch.Tensor | None = None

    return SIDFusedOutput


def supports_compact_head(model) -> bool:
    """Whether the compact path reproduces TRL's logits for ``model`` (no soft-capping, no logit scaling)."""
    config = model.config.get_text_config()
    return all(
        getattr(config, name, None) is None
        for name in (
            "final_logit_softcapping",
            "logit_scale",
            "output_multiplier",
            "lm_head_multiplier",
            "logits_scaling",
        )
    )


def head_rows(model, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(weight[ids], bias[ids])`` of ``model``'s output layer, grounded rows included (differentiable w.r.t.
    them): the rows a softmax over ``ids`` needs, never the whole ``vocab x d`` matrix."""
    head = model.get_output_embeddings()
    if hasattr(head, "rows"):  # GroundedHead
        return head.rows(ids)
    bias = getattr(head, "bias", None)
    return head.weight[ids.to(head.weight.device)], None if bias is None else bias[ids.to(bias.device)]


def sid_columns(ids: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(column, inside)``: each token's column among the sorted ``ids``, and whether it is one of them."""
    column = torch.searchsorted(ids, tokens).clamp(max=ids.numel() - 1)
    return column, ids[column] == tokens


def _token_stats(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``(log p(target), entropy, target is the argmax)`` of each row of float ``logits``."""
    log_z = torch.logsumexp(logits, dim=-1)
    log_probs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_z
    with torch.no_grad():
        probs = torch.softmax(logits, dim=-1)
        entropy = log_z - (probs * logits).sum(-1)
        is_top1 = logits.argmax(-1) == targets
    return log_probs, entropy, is_top1


def compact_fused_forward(
    model,
    *args,
    labels: torch.Tensor,
    num_items_in_batch=None,
    sid_ids: torch.Tensor | None = None,
    sid_targets: torch.Tensor | None = None,
    sid_temperature: float = 1.0,
    **kwargs,
):
    """``FusedCausalLMOutput`` of ``model`` (a transformers causal LM) from the labelled positions only.

    ``sid_ids`` (sorted token ids): the SID-only softmax. A position whose target is one of them is
    normalised over those rows only (``hidden @ W[sid_ids].T``, through the model's own head rows); any
    other labelled target (an end-of-turn token after the SID) keeps the whole vocabulary. With every
    vocabulary row in ``sid_ids`` this is the full loss.

    ``sid_targets`` ``[N, k]`` (needs ``sid_ids``): token ids of the SID rows, one row per SID target in
    row-major order; ``sid_temperature`` divides the SID logits (a sharper or flatter softmax for the loss).
    The output is then a ``SIDFusedOutput`` (:func:`sid_fused_output`) with their SID-only log-probabilities. The
    loss and ``log_probs`` are the same as without it."""
    from trl.trainer.utils import FusedCausalLMOutput

    if sid_targets is not None and sid_ids is None:
        raise ValueError("sid_targets are scored by the SID-only softmax: pass sid_ids too")
    kwargs["use_cache"] = False
    hidden = model.base_model(*args, **kwargs).last_hidden_state[:, :-1]
    labels = labels[:, 1:].to(hidden.device)
    mask = labels != -100
    hidden, targets = hidden[mask], labels[mask]
    if sid_ids is None:
        logits = model.get_output_embeddings()(hidden).float()
        log_probs, entropy, is_top1 = _token_stats(logits, targets)
    else:
        sid_ids = sid_ids.to(hidden.device)
        column, inside = sid_columns(sid_ids, targets)
        weight, bias = head_rows(model, sid_ids)
        with torch.autocast(hidden.device.type, enabled=False):  # in the hidden states' dtype
            sid_logits = torch.nn.functional.linear(
                hidden[inside], weight.to(hidden.dtype), None if bias is None else bias.to(hidden.dtype)
            ).float()
        if sid_temperature != 1.0:
            sid_logits = sid_logits / sid_temperature
        sid_stats = _token_stats(sid_logits, column[inside])
        if sid_targets is not None:
            gathered = _gather_log_probs(sid_logits, sid_ids, sid_targets.to(hidden.device))
        rest = ~inside  # other targets (if any) through the whole head; an empty batch costs nothing
        rest_stats = _token_stats(model.get_output_embeddings()(hidden[rest]).float(), targets[rest])
        log_probs, entropy, is_top1 = (
            a.new_zeros(targets.shape).masked_scatter(inside, a).masked_scatter(rest, b)
            for a, b in zip(sid_stats, rest_stats, strict=True)
        )

    def scatter(values: torch.Tensor) -> torch.Tensor:
        return values.new_zeros(mask.shape).masked_scatter(mask, values)

    per_token = scatter(log_probs)
    count = mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch
    fields = dict(
        loss=-per_token.sum() / count,
        log_probs=per_token,
        entropy=scatter(entropy),
        is_top1=scatter(is_top1),
        label_mask=mask,
    )
    if sid_targets is None:
        return FusedCausalLMOutput(**fields)
    sid_mask = torch.zeros_like(mask)
    sid_mask[mask] = inside
    return sid_fused_output()(**fields, sid_log_probs=gathered, sid_mask=sid_mask)


def _gather_log_probs(sid_logits: torch.Tensor, sid_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The SID-only log-probabilities ``[N, k]`` of the token ids ``targets`` ``[N, k]`` under ``sid_logits``."""
    if targets.ndim != 2 or targets.shape[0] != sid_logits.shape[0]:
        raise ValueError(
            f"sid_targets has shape {tuple(targets.shape)}, expected [{sid_logits.shape[0]}, k]: one row per "
            "labelled SID token of the batch"
        )
    column, inside = sid_columns(sid_ids, targets.reshape(-1))
    if not bool(inside.all()):
        raise ValueError("sid_targets holds token ids that are not SID rows (sid_ids)")
    log_probs = sid_logits.log_softmax(dim=-1)
    return log_probs.gather(1, column.view(targets.shape))


def causal_lm(model):
    """The transformers causal LM inside ``model`` (under DDP's ``module`` and PEFT's wrappers)."""
    model = getattr(model, "module", model)
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def takes_compact_path(lm, kwargs: dict) -> bool:
    """Whether a forward call with ``kwargs`` is TRL's fused-head call that :func:`compact_fused_forward`
    reproduces for ``lm``."""
    return bool(
        kwargs.get("fused_lm_head")
        and kwargs.get("labels") is not None
        and kwargs.get("shift_labels") is None
        and not kwargs.get("output_router_logits")  # MoE: TRL adds the router loss from TRL's own output
        and supports_compact_head(lm)
    )


@contextmanager
def compact_head(
    model,
    *,
    sid_ids: torch.Tensor | None = None,
    sid_targets: torch.Tensor | None = None,
    sid_temperature: float = 1.0,
) -> Iterator[None]:
    """While open, TRL's fused-head calls on ``model``'s causal LM go through :func:`compact_fused_forward`
    (with ``sid_ids``: the SID-only softmax; ``sid_targets``/``sid_temperature`` as there); every other call
    runs the model's own forward. Raises where ``sid_ids`` is given and a call cannot take the compact path."""
    if sid_targets is not None and sid_ids is None:
        raise ValueError("sid_targets are scored by the SID-only softmax: pass sid_ids too")
    if sid_temperature != 1.0 and sid_ids is None:
        raise ValueError("sid_temperature applies to the SID-only softmax: pass sid_ids too")
    lm = causal_lm(model)
    own = lm.__dict__.get("forward")
    original = lm.forward

    def forward(*args, **kwargs):
        if not takes_compact_path(lm, kwargs):
            if sid_ids is not None and kwargs.get("fused_lm_head"):
                raise ValueError(
                    "the SID-only softmax scores TRL's fused head (fused_lm_head=True with labels) through the "
                    "SID rows; this call cannot: it has pre-shifted labels, MoE router logits, or the model "
                    "scales or soft-caps its logits. Train such a model with sid_softmax_loss=False."
                )
            return original(*args, **kwargs)
        kwargs.pop("fused_lm_head")
        kwargs.pop("shift_labels", None)
        return compact_fused_forward(
            lm, *args, sid_ids=sid_ids, sid_targets=sid_targets, sid_temperature=sid_temperature, **kwargs
        )

    lm.forward = forward
    try:
        yield
    finally:
        if own is None:
            del lm.forward
        else:
            lm.forward = own
