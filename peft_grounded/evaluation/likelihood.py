"""How likely a model finds each user's held-out item: a continuous companion to Recall/NDCG.

Recall@K on a few hundred users is a count of rare hits: at small training budgets it is zero or one
hit for every strategy and cannot tell them apart. The log-likelihood of the target's SID moves with
every step of training. Per user it is measured two ways:

* ``nll``: ``-log p(SID | prompt)`` under the full vocabulary (format and item together);
* ``constrained_nll``: the same with each step's distribution renormalised over the tokens the SID trie
  allows, i.e. ``-log p(item)`` under the distribution the constrained beam search ranks by; its
  reference ``uniform_nll`` is the value of a model that spreads its mass evenly over the trie.

Results are means over a part's sampled users (the same users as :func:`~.users.evaluate_model`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from .users import EvalSettings, _autocast, _part_prompts, item_token_ids

LIKELIHOOD_METRICS = ("nll", "constrained_nll", "uniform_nll")


@torch.no_grad()
def target_log_likelihood(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    targets: Sequence[Sequence[int]],
    trie: Any,
    batch_size: int = 16,
) -> list[dict[str, float]]:
    """Per prompt, ``{"nll", "constrained_nll", "uniform_nll"}`` of its target token ids (in nats).

    Each prompt must end exactly where the SID starts (as :func:`~peft_grounded.prompts.inference_prompts`
    builds them), and each target must be a complete SID of ``trie``.
    """
    if len(prompts) != len(targets):
        raise ValueError(f"{len(prompts)} prompts for {len(targets)} targets: give one target per prompt")
    for i, target in enumerate(targets):
        if trie.item_of(target) is None:
            raise ValueError(
                f"target {i} ({list(target)}) is not a SID of the trie: score only catalogue items"
            )
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
            width, keep = max(map(len, seqs)), max(len(targets[i]) for i in chunk) + 1
            input_ids = torch.full((len(seqs), width), pad, dtype=torch.long)
            mask = torch.zeros_like(input_ids)
            for row, seq in enumerate(seqs):  # left padding: every target ends in the last column
                input_ids[row, width - len(seq) :] = torch.tensor(seq)
                mask[row, width - len(seq) :] = 1
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            logits = model(
                input_ids=input_ids.to(device),
                attention_mask=mask.to(device),
                position_ids=positions.to(device),
                logits_to_keep=keep,
            ).logits.float()
            log_probs = logits.log_softmax(-1)
            for row, i in enumerate(chunk):
                target = [int(t) for t in targets[i]]
                first = keep - 1 - len(target)  # kept column whose logits predict the target's first token
                full = constrained = uniform = 0.0
                for j, token in enumerate(target):
                    allowed = trie.allowed_tokens(target[:j])
                    column = logits[row, first + j]
                    full += float(log_probs[row, first + j, token])
                    constrained += float(column[token] - column[allowed].logsumexp(-1))
                    uniform += math.log(len(allowed))
                out.append({"nll": -full, "constrained_nll": -constrained, "uniform_nll": uniform})
    finally:
        model.train(was_training)
    return out


def evaluate_likelihood(
    model: Any,
    tokenizer: Any,
    split: Any,
    index: Any,
    catalogue: Any = None,
    fmt: Any = None,
    parts: tuple[str, ...] = ("valid", "test"),
    settings: EvalSettings | None = None,
    trie: Any = None,
) -> dict[str, dict[str, dict[str, float | int | None]]]:
    """``{part: {"all": means, "cold": means}}`` of :func:`target_log_likelihood` on the sampled users."""
    from ..decoding import SIDTrie
    from ..prompts import PromptFormat

    settings = settings or EvalSettings()
    fmt = fmt or PromptFormat()
    sids = item_token_ids(tokenizer, index)
    trie = trie or SIDTrie(sids)
    cold_items = split.cold_items(settings.cold_max_count)
    results: dict[str, dict[str, dict[str, float | int | None]]] = {}
    for part in parts:
        (chosen, cold_chosen, cold_pool), (users, prompts, targets) = _part_prompts(
            split, part, settings, cold_items, index, tokenizer, catalogue, fmt
        )
        with _autocast(model, settings):
            scores = target_log_likelihood(
                model, tokenizer, prompts, [sids[t] for t in targets], trie, settings.batch_size
            )
        by_user = dict(zip(users, scores, strict=True))
        results[part] = {"all": _means([by_user[e[0]] for e in chosen])}
        if settings.cold:
            cold = _means([by_user[e[0]] for e in cold_chosen])
            results[part]["cold"] = cold | {"cold_users_available": len(cold_pool)}
    return results


def _means(scores: list[dict[str, float]]) -> dict[str, float | int | None]:
    means: dict[str, float | int | None] = {
        name: (math.fsum(s[name] for s in scores) / len(scores) if scores else None)
        for name in LIKELIHOOD_METRICS
    }
    return means | {"users": len(scores)}
