"""The SID head: TRL's fused LM head from the labelled positions only, and the SID-only softmax.

TRL 1.16's ``SFTTrainer`` calls ``model(..., fused_lm_head=True)`` and reads per-token log-probabilities
from a ``FusedCausalLMOutput``. On CUDA it projects only the positions whose label is not ``-100``; on
other devices it projects every position through the whole vocabulary and back-propagates a full
``vocab x d`` weight gradient. With a completion-only loss (a SID of 4 tokens after a prompt of 60) that
is mostly wasted work (BENCHMARKS.md, "SID-only softmax: step time and decoding").

:func:`compact_fused_forward` returns the same output object, computed from the labelled positions only,
through the model's own head (so the grounded rows get their gradient as usual). The trainers of this
package install it around TRL's ``compute_loss`` with :func:`compact_head`; models with logit soft-capping or
scaling, pre-shifted labels, and MoE forwards asked for router logits (whose load-balancing loss TRL reads from
the output) keep TRL's own path. The loss lives here, not in the adapter: the adapter's forward is PEFT's.

With ``sid_ids`` (``RecommendationConfig.sid_softmax``) it is also the SID-only softmax: a SID target's
logits are ``hidden @ W[sid_ids].T``, normalised over the SID rows only (:func:`head_rows` reads just those
rows of the head, the grounded ones from the adapter), so a step never projects onto the text vocabulary.
With ``sid_targets`` as well it returns the SID-only log-probabilities of given token ids at each SID target
(:func:`sid_fused_output`), from which a trainer builds a soft-target loss (distillation).

Training (the trainers install :func:`compact_head`) and decoding (:mod:`peft_grounded.decoding.heads`) both
import it; it imports neither.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache

import torch


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
                    "scales or soft-caps its logits. Train such a model with sid_softmax=False."
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
