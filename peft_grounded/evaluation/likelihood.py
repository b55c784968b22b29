"""How likely a model finds each user's held-out item: a continuous companion to Recall/NDCG.

Recall@K on a few hundred users is a count of rare hits: at small training budgets it is zero or one
hit for every strategy and cannot tell them apart. The log-likelihood of the target's SID moves with
every step of training. Per user it is measured two ways:

* ``nll``: ``-log p(SID | prompt)`` under the full vocabulary (format and item together), or under the
  SID rows only for a model trained with the SID-only softmax (``sid_softmax_loss``, recorded in its adapter);
* ``constrained_nll``: the same with each step's distribution renormalised over the tokens the SID trie
  allows, i.e. ``-log p(item)`` under the distribution the constrained beam search ranks by; its
  reference ``uniform_nll`` is the value of a model that spreads its mass evenly over the trie.

Per-user values and their means over a part's sampled users come from :func:`~.evaluator.evaluate`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..decoding.heads import StepHead
from ..decoding.scoring import target_nlls
from ..decoding.search import left_pad
from ..decoding.trie import check_targets

LIKELIHOOD_METRICS = ("nll", "constrained_nll", "uniform_nll")


@torch.no_grad()
def target_log_likelihood(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    targets: Sequence[Sequence[int]],
    trie: Any,
    batch_size: int = 16,
    sid_softmax: Any = None,
) -> list[dict[str, float]]:
    """Per prompt, ``{"nll", "constrained_nll", "uniform_nll"}`` of its target token ids (in nats).

    Each prompt must end exactly where the SID starts (as :func:`~peft_grounded.prompts.inference_prompts`
    builds them), and each target must be a complete SID of ``trie``. ``sid_softmax``: ``nll`` normalised
    over the SID rows only (None: as the model's adapter was trained, see
    :class:`~peft_grounded.decoding.heads.StepHead`).
    """
    check_targets(targets, trie, len(prompts))
    head = StepHead.for_model(model, sid_softmax)
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id or 0
    was_training = model.training
    model.eval()
    out: list[dict[str, float]] = []
    try:
        for start in range(0, len(prompts), batch_size):
            chunk = range(start, min(start + batch_size, len(prompts)))
            seqs = [
                tokenizer(prompts[i], add_special_tokens=False)["input_ids"] + list(targets[i]) for i in chunk
            ]
            keep = max(len(targets[i]) for i in chunk) + 1
            input_ids, mask = left_pad(seqs, pad)  # every target ends in the last column
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            logits, _ = head(
                model,
                keep,
                input_ids=input_ids.to(device),
                attention_mask=mask.to(device),
                position_ids=positions.to(device),
            )
            chunk_targets = [list(map(int, targets[i])) for i in chunk]
            out.extend(target_nlls(logits, chunk_targets, keep, trie, head.sid_ids))
    finally:
        model.train(was_training)
    return out
