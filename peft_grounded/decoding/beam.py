"""The package's one SID-constrained beam search (fixed-length SIDs): the same search as transformers'
``generate`` with a SID logits processor (greedy beam search, no length penalty, scores = summed
log-probabilities; ``tests/helpers/generate_reference.py`` holds that reference), with less work per user:

* the prompt is encoded once per user (all tokens but the last, then the last one on one row per user)
  and its KV cache is repeated to the beams only after the first SID token is chosen, so no beam forward
  is spent on the first step (``generate`` runs the last prompt token once per beam);
* each step keeps only the head's last position, and ranks the trie's allowed continuations of every
  beam (at most the trie's branching factor) instead of a masked copy of the whole vocabulary;
* the prompt's cache is not repeated to the beams: each beam step appends the beams' tokens to their
  prompt's cache row and a 4D attention mask lets every beam see the prompt and its own ancestors only
  (sdpa and eager attention; other implementations repeat the cache to the beams and reorder it between
  steps).

:func:`~.search.recommend` batches prompts through it.

:func:`target_nlls` (below) scores target SIDs from the logits: negative log-likelihoods under the full
vocabulary, renormalised over the trie (what the search ranks by), and under a uniform walk of the trie.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from .heads import StepHead
from .trie import SIDTrie


def _cache_of(output: Any) -> Any:
    for name in ("cache", "past_key_values"):  # the attribute was renamed during transformers 5.x
        cache = getattr(output, name, None)
        if cache is not None:
            return cache
    raise RuntimeError(
        "the model returned no KV cache with use_cache=True; the constrained beam search needs one (a "
        "transformers causal LM gives it)"
    )


def _candidates(
    trie: SIDTrie,
    nodes: torch.Tensor,
    log_probs: torch.Tensor,
    base: torch.Tensor,
    head: StepHead,
    open_nodes: torch.Tensor | None = None,
    rows_per_prompt: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(scores, tokens)``, each ``[rows, max degree]``: every allowed continuation of every row, scored
    ``base + log p(token)`` (``log_probs`` in ``head``'s columns), in token order; absent slots score ``-inf``,
    and so does a continuation into a node that ``open_nodes`` (``[prompts, nodes]``, each prompt's
    ``rows_per_prompt`` consecutive rows reading its own row) closes."""
    t = trie.tensors(nodes.device)
    rows, tokens, children = trie.allowed_edges(nodes)
    live = nodes >= 0
    degree = torch.where(live, t["degree"][nodes.clamp(min=0)], 0)
    width = max(int(degree.max()), 1) if degree.numel() else 1
    offsets = torch.repeat_interleave(torch.cumsum(degree, 0) - degree, degree, output_size=rows.numel())
    columns = torch.arange(rows.numel(), device=nodes.device) - offsets
    scores = torch.full((nodes.shape[0], width), float("-inf"), device=nodes.device)
    values = base[rows] + log_probs[rows, head.columns(tokens)]
    if open_nodes is not None:
        prompt = torch.div(rows, rows_per_prompt, rounding_mode="floor")
        values = values.masked_fill(~open_nodes[prompt, children], float("-inf"))
    scores[rows, columns] = values
    chosen = torch.zeros((nodes.shape[0], width), dtype=torch.long, device=nodes.device)
    chosen[rows, columns] = tokens
    return scores, chosen


def _cache_argument(model: Any) -> str:
    """The forward's name for the KV cache (``past_key_values`` became ``cache`` during transformers 5.x)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        parameters = inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in parameters else "past_key_values"


def _forward(model: Any, head: StepHead, keep: int = 1, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """``(float logits of the last keep positions in head's columns, output)`` of a cached forward."""
    if "past_key_values" in kwargs:
        kwargs[_cache_argument(model)] = kwargs.pop("past_key_values")
    try:
        return head(model, keep, **kwargs)
    except TypeError as err:
        raise TypeError(
            f"the model's forward rejected the cached decoding or scoring call ({err}); it needs input_ids, "
            "attention_mask, position_ids, past_key_values, use_cache and logits_to_keep (a transformers causal "
            "LM of version 4.45 or later takes them)"
        ) from err


@torch.no_grad()
def constrained_beam_search(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    trie: SIDTrie,
    num_beams: int,
    targets: torch.Tensor | None = None,
    shared_prompt: bool | None = None,
    head: StepHead | None = None,
    open_nodes: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, list[dict[str, float]] | None]:
    """``(tokens [prompts, num_beams, L], scores [prompts, num_beams], target NLLs)`` for left-padded
    prompts and a fixed-length trie. Beams that could not be filled (fewer reachable items than beams)
    score ``-inf``. With ``targets`` (``[prompts, L]`` SID token ids) each prompt's target is also scored
    (:func:`~.beam.target_nlls`) from the same prompt cache: ``L - 1`` teacher-forced tokens per prompt,
    before the beams start; otherwise the NLLs are ``None``. ``shared_prompt``: keep one cache row per
    prompt and mask the beams apart (:class:`_SharedPrompt`; default when the attention is sdpa or eager),
    or repeat the prompt's cache to every beam (:class:`_RepeatedPrompt`). ``head``: what each step scores
    (:class:`~.heads.StepHead`; default the whole vocabulary; the SID rows only for a model trained with
    the SID-only softmax). ``open_nodes`` (``[prompts, trie nodes]``, :meth:`~.trie.SIDTrie.open_nodes`): a
    prompt's beams only enter nodes still leading to an item it does not exclude, so excluded items (a
    user's history) take no beam."""
    if not trie.fixed_length:
        raise ValueError(
            "constrained_beam_search needs SIDs of one length (every SID index gives one length)"
        )
    head = head or StepHead(model)
    prompts = input_ids.shape[0]
    positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    cache = None
    if input_ids.shape[1] > 1:  # all prompt tokens but the last, once per prompt
        cache = _cache_of(
            _forward(
                model,
                head,
                input_ids=input_ids[:, :-1],
                attention_mask=attention_mask[:, :-1],
                position_ids=positions[:, :-1],
            )[1]
        )
    logits, output = _forward(
        model,
        head,
        input_ids=input_ids[:, -1:],
        attention_mask=attention_mask,
        position_ids=positions[:, -1:],
        past_key_values=cache,
    )
    cache = _cache_of(output)
    first_logits = logits[:, -1, :]
    head.check(trie, first_logits.shape[-1])
    nlls = None
    if targets is not None:
        nlls = _score_targets(
            model, head, cache, first_logits, targets, attention_mask, positions[:, -1:], trie
        )
    empty = input_ids.new_zeros(prompts, 0)
    generated, beam_scores, _ = _select(
        trie,
        head,
        empty,
        first_logits.log_softmax(-1),
        first_logits.new_zeros(prompts),
        prompts,
        num_beams,
        open_nodes,
    )
    if shared_prompt and not _mask_kind(model):
        raise ValueError("shared_prompt needs sdpa or eager attention (a custom 4D mask)")
    shared = bool(_mask_kind(model)) if shared_prompt is None else shared_prompt
    generated, beam_scores = _beam_steps(
        model,
        head,
        cache,
        attention_mask,
        positions[:, -1:],
        generated,
        beam_scores,
        trie,
        num_beams,
        open_nodes,
        shared,
    )
    return generated.view(prompts, num_beams, -1), beam_scores.view(prompts, num_beams), nlls


def _select(
    trie: SIDTrie,
    head: StepHead,
    generated: torch.Tensor,
    log_probs: torch.Tensor,
    beam_scores: torch.Tensor,
    prompts: int,
    num_beams: int,
    open_nodes: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One beam step for every prompt: the ``num_beams`` best continuations of its rows.

    ``generated`` ``[prompts * rows, steps]`` holds each prompt's current rows (its beams, or one row
    before the first token), ``log_probs`` their next-token log-probabilities in ``head``'s columns and
    ``beam_scores`` their scores. Returns the new ``generated`` ``[prompts * num_beams, steps + 1]`` and
    scores, and each new beam's parent (its row among its prompt's, ``[prompts, num_beams]``). A prompt
    with fewer continuations than beams gets ``-inf`` beams (token 0)."""
    rows = generated.shape[0] // prompts
    scores, tokens = _candidates(
        trie, trie.walk(generated), log_probs, beam_scores, head, open_nodes, rows_per_prompt=rows
    )
    width = scores.shape[1]
    scores, tokens = scores.view(prompts, rows * width), tokens.view(prompts, rows * width)
    if rows * width < num_beams:  # fewer continuations than beams: pad with empty beams
        pad = num_beams - rows * width
        scores = torch.nn.functional.pad(scores, (0, pad), value=float("-inf"))
        tokens = torch.nn.functional.pad(tokens, (0, pad), value=0)
    best, index = scores.topk(num_beams, dim=1)
    parent = torch.div(index, width, rounding_mode="floor").clamp(max=rows - 1)
    offsets = (torch.arange(prompts, device=generated.device) * rows)[:, None]
    chosen = tokens.gather(1, index).reshape(-1, 1)
    generated = torch.cat([generated[(offsets + parent).reshape(-1)], chosen], dim=1)
    return generated, best.reshape(-1), parent


def _mask_kind(model: Any) -> str | None:
    """``"bool"`` (sdpa) or ``"float"`` (eager) when the model's attention takes a custom 4D mask as given."""
    implementation = getattr(getattr(model, "config", None), "_attn_implementation", None)
    return {"sdpa": "bool", "eager": "float"}.get(implementation)


class _SharedPrompt:
    """Beam steps with one cache row per prompt: the beams' tokens are appended to their prompt's row
    (``num_beams`` columns per step) and a 4D mask lets each beam see the prompt and its own ancestors, so
    the prompt's cache is never repeated to the beams nor reordered (sdpa and eager attention)."""

    def __init__(self, model: Any, cache: Any, attention_mask: torch.Tensor, num_beams: int) -> None:
        self.prompts, width = attention_mask.shape
        self.num_beams, self.kind = num_beams, _mask_kind(model)
        device = attention_mask.device
        self.slots = torch.arange(num_beams, device=device).expand(self.prompts, num_beams)
        self.path = self.slots[:, :, None]  # path[p, j, g]: the slot of beam j's token fed at forward g
        self.prompt_mask = attention_mask.bool()[:, None, None, :].expand(self.prompts, 1, num_beams, width)

    def inputs(self, step: int, generated: torch.Tensor, last_position: torch.Tensor) -> dict[str, Any]:
        prompts, beams = self.prompts, self.num_beams
        own = torch.zeros(prompts, beams, step, beams, dtype=torch.bool, device=generated.device)
        own.scatter_(3, self.path[..., None], True)
        mask = torch.cat([self.prompt_mask, own.view(prompts, 1, beams, step * beams)], dim=-1)
        if self.kind == "float":
            mask = torch.zeros(mask.shape, device=mask.device).masked_fill(
                ~mask, torch.finfo(torch.float32).min
            )
        return dict(
            keep=0,
            input_ids=generated[:, -1].view(prompts, beams),
            attention_mask=mask,
            position_ids=(last_position + step).expand(prompts, beams),
        )

    def follow(self, parent: torch.Tensor, step: int, cache: Any) -> None:
        kept = self.path.gather(1, parent[:, :, None].expand(-1, -1, step))
        self.path = torch.cat([kept, self.slots[:, :, None]], dim=2)


class _RepeatedPrompt:
    """Beam steps with the prompt's cache repeated to every beam and reordered after each step (any
    attention implementation)."""

    def __init__(self, model: Any, cache: Any, attention_mask: torch.Tensor, num_beams: int) -> None:
        cache.batch_repeat_interleave(num_beams)
        self.mask = attention_mask.repeat_interleave(num_beams, 0)
        prompts = attention_mask.shape[0]
        self.num_beams = num_beams
        self.offsets = (torch.arange(prompts, device=attention_mask.device) * num_beams)[:, None]

    def inputs(self, step: int, generated: torch.Tensor, last_position: torch.Tensor) -> dict[str, Any]:
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.mask.shape[0], 1)], dim=1)
        position = last_position.repeat_interleave(self.num_beams, 0) + step
        return dict(input_ids=generated[:, -1:], attention_mask=self.mask, position_ids=position)

    def follow(self, parent: torch.Tensor, step: int, cache: Any) -> None:
        cache.reorder_cache((self.offsets + parent).reshape(-1))


def _beam_steps(
    model: Any,
    head: StepHead,
    cache: Any,
    attention_mask: torch.Tensor,
    last_position: torch.Tensor,
    generated: torch.Tensor,
    beam_scores: torch.Tensor,
    trie: SIDTrie,
    num_beams: int,
    open_nodes: torch.Tensor | None = None,
    shared: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The beam steps after the first SID token: one forward of every beam per step (fed as ``shared``
    says: :class:`_SharedPrompt` or :class:`_RepeatedPrompt`), then :func:`_select`."""
    prompts = attention_mask.shape[0]
    feed = (_SharedPrompt if shared else _RepeatedPrompt)(model, cache, attention_mask, num_beams)
    for step in range(1, trie.max_length):
        logits, _ = _forward(
            model, head, **feed.inputs(step, generated, last_position), past_key_values=cache
        )
        log_probs = logits.reshape(prompts * num_beams, -1).log_softmax(-1)  # one position per beam
        generated, beam_scores, parent = _select(
            trie, head, generated, log_probs, beam_scores, prompts, num_beams, open_nodes
        )
        if step + 1 < trie.max_length:
            feed.follow(parent, step, cache)
    return generated, beam_scores


def _score_targets(
    model: Any,
    head: StepHead,
    cache: Any,
    first_logits: torch.Tensor,
    targets: torch.Tensor,
    attention_mask: torch.Tensor,
    last_position: torch.Tensor,
    trie: SIDTrie,
) -> list[dict[str, float]]:
    """The targets' NLLs from the prompt cache; the cache is cropped back to the prompt afterwards."""
    length = targets.shape[1]
    columns = [first_logits[:, None, :]]
    if length > 1:
        mask = torch.cat(
            [attention_mask, attention_mask.new_ones(attention_mask.shape[0], length - 1)], dim=1
        )
        steps = torch.arange(1, length, device=targets.device)[None, :]
        logits, _ = _forward(
            model,
            head,
            keep=length - 1,
            input_ids=targets[:, :-1],
            attention_mask=mask,
            position_ids=last_position + steps,
            past_key_values=cache,
        )
        columns.append(logits)
        cache.crop(-(length - 1))  # drop the teacher-forced target tokens again
    logits = torch.cat(columns, dim=1)  # column j predicts target token j
    return target_nlls(logits, targets.tolist(), length + 1, trie, head.sid_ids)


# Negative log-likelihoods of target SIDs from a model's logits: under the full vocabulary, renormalised
# over the SID trie (what the constrained beam search ranks by), and under a uniform walk of the trie.


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
