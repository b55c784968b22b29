"""Negative log-likelihoods of target SIDs from a model's logits: under the full vocabulary, renormalised
over the SID trie (what the constrained beam search ranks by), and under a uniform walk of the trie."""

from __future__ import annotations

from typing import Any

import torch


def target_nlls(
    logits: torch.Tensor,
    targets: list[list[int]],
    keep: int,
    trie: Any,
    sid_ids: torch.Tensor | None = None,
) -> list[dict[str, float]]:
    """``{"nll", "constrained_nll", "uniform_nll"}`` of each row's target SID, with one host transfer.

    ``logits[row, keep - 1 - len(target) + j]`` must predict ``target[j]`` (the last ``keep`` positions of
    left-padded prompt + target sequences; column ``j`` when ``keep = len + 1``). ``constrained_nll``
    renormalises each step over the tokens the trie allows there; ``uniform_nll`` is the NLL of a model
    spreading its mass evenly over the trie. ``sid_ids`` (sorted token ids): the logits hold those columns
    only (a model trained with the SID-only softmax), so ``nll`` is normalised over the SID rows.
    """
    rows, width = len(targets), max(map(len, targets))
    device = logits.device
    padded = torch.full((rows, width), -1, dtype=torch.long)
    for row, target in enumerate(targets):
        padded[row, : len(target)] = torch.tensor(target)
    padded = padded.to(device)
    lengths = torch.tensor([len(t) for t in targets], device=device)
    degree = trie.tensors(device)["degree"]
    pair_rows, pair_cols, pair_tokens, pair_nodes = [], [], [], []
    for j in range(width):  # the node before each target token: one vectorised trie walk per SID position
        live = (lengths > j).nonzero().flatten()
        nodes = trie.walk(padded[live, :j])
        pair_rows.append(live)
        pair_cols.append(keep - 1 - lengths[live] + j)
        pair_tokens.append(padded[live, j])
        pair_nodes.append(nodes)
    r, c, tok, nodes = (torch.cat(x) for x in (pair_rows, pair_cols, pair_tokens, pair_nodes))
    columns = logits[r, c]  # [pairs, vocab or SID rows]: the logits predicting each target token
    if sid_ids is None:
        allowed = trie.allowed_mask(nodes, columns.shape[-1])
    else:
        sid_ids = sid_ids.to(device)
        tok = torch.searchsorted(sid_ids, tok)
        allowed = torch.zeros(columns.shape, dtype=torch.bool, device=device)
        pairs, tokens = trie.allowed_pairs(nodes)
        allowed[pairs, torch.searchsorted(sid_ids, tokens)] = True
    full = columns.log_softmax(-1).gather(1, tok[:, None]).squeeze(1)
    constrained = columns.gather(1, tok[:, None]).squeeze(1) - columns.masked_fill(
        ~allowed, float("-inf")
    ).logsumexp(-1)
    uniform = degree[nodes.clamp(min=0)].double().log()
    sums = torch.zeros(3, rows, dtype=torch.float64, device=device)
    for k, values in enumerate((full, constrained, uniform)):
        sums[k].index_add_(0, r, values.double())
    nll, cnll, unif = (-sums[0]).tolist(), (-sums[1]).tolist(), sums[2].tolist()
    return [{"nll": nll[i], "constrained_nll": cnll[i], "uniform_nll": unif[i]} for i in range(rows)]
