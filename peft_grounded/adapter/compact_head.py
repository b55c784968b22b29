"""TRL's fused LM head, scoring only the labelled positions, on every device.

TRL 1.16's ``SFTTrainer`` calls ``model(..., fused_lm_head=True)`` and reads per-token log-probabilities
from a ``FusedCausalLMOutput``. On CUDA it projects only the positions whose label is not ``-100``; on
other devices it projects every position through the whole vocabulary and back-propagates a full
``vocab x d`` weight gradient. With a completion-only loss (a SID of 4 tokens after a prompt of 60) that
is >90% wasted work: on a 2-core CPU, 40% of a SmolLM2-135M step.

:func:`compact_fused_forward` returns the same output object, computed from the labelled positions only,
through the model's own head (so the grounded rows get their gradient as usual). The trainers of this
package request it with ``compact_fused_lm_head=True``; models with logit soft-capping or scaling,
pre-shifted labels, and MoE forwards asked for router logits (whose load-balancing loss TRL reads from
the output) keep TRL's own path.
"""

from __future__ import annotations

import torch


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


def compact_fused_forward(model, *args, labels: torch.Tensor, num_items_in_batch=None, **kwargs):
    """``FusedCausalLMOutput`` of ``model`` (a transformers causal LM) from the labelled positions only."""
    from trl.trainer.utils import FusedCausalLMOutput

    kwargs["use_cache"] = False
    hidden = model.base_model(*args, **kwargs).last_hidden_state[:, :-1]
    labels = labels[:, 1:].to(hidden.device)
    mask = labels != -100
    logits = model.get_output_embeddings()(hidden[mask]).float()
    log_z = torch.logsumexp(logits, dim=-1)
    targets = labels[mask]
    log_probs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_z
    with torch.no_grad():
        probs = torch.softmax(logits, dim=-1)
        entropy = log_z - (probs * logits).sum(-1)
        is_top1 = logits.argmax(-1) == targets

    def scatter(values: torch.Tensor) -> torch.Tensor:
        return values.new_zeros(mask.shape).masked_scatter(mask, values)

    per_token = scatter(log_probs)
    count = mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch
    return FusedCausalLMOutput(
        loss=-per_token.sum() / count,
        log_probs=per_token,
        entropy=scatter(entropy),
        is_top1=scatter(is_top1),
        label_mask=mask,
    )
