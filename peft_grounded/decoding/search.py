"""The package's SID-constrained beam search: :func:`recommend` turns prompts into each prompt's top-``k``
items with the one engine it serves with (:func:`~.beam.constrained_beam_search`, SIDs of one length);
:func:`model_beams` turns users' histories into the model's beams (their prompts, then :func:`recommend` over
an index's trie), the search that serving and the new-item beams share.

transformers' ``generate`` with a SID logits processor is the same search, slower (every prompt encoded
once per beam); it is kept out of the package, in ``tests/helpers/generate_reference.py``, as the reference
the tests compare this engine with.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from .beam import constrained_beam_search
from .heads import SIDSoftmax, StepHead
from .trie import SIDTrie, check_targets, item_token_ids

FILLER_SCORE = -1e8
"""Beams scoring below this are padding (a prompt with fewer reachable items than beams), not items."""


@dataclass
class Recommendations:
    """Top-K items per prompt, best first, with their SID log-probabilities and decoding counters.

    ``num_invalid`` counts scored beams whose tokens are not a catalogue SID and ``num_duplicate`` scored
    beams repeating an item ranked higher; both are 0 by construction (``recommend(strict=True)`` raises
    otherwise). ``num_filler`` counts padding beams (score ~ -1e9) that beam search returns when fewer than
    ``num_beams`` items are reachable; they are dropped, not errors.
    """

    items: list[list[Hashable]]
    scores: list[list[float]]
    k: int
    num_beams: int
    num_beams_returned: int = 0
    num_invalid: int = 0
    num_duplicate: int = 0
    num_filler: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def invalid_rate(self) -> float:
        """Share of scored (non-filler) beams that were not a valid, new item."""
        scored = self.num_beams_returned - self.num_filler
        return (self.num_invalid + self.num_duplicate) / scored if scored else 0.0

    def stats(self) -> dict[str, float | int]:
        """The decoding counters as a JSON-able dict."""
        return {
            "prompts": len(self.items),
            "k": self.k,
            "num_beams": self.num_beams,
            "beams_returned": self.num_beams_returned,
            "invalid": self.num_invalid,
            "duplicate": self.num_duplicate,
            "filler": self.num_filler,
            "invalid_rate": self.invalid_rate,
        }


@contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Within the block: the model in eval mode (dropout off); its mode is restored on exit."""
    was_training = model.training
    try:
        model.eval()
        yield
    finally:
        model.train(was_training)


def recommend(
    model: torch.nn.Module,
    tokenizer: Any,
    prompts: Sequence[str] | Sequence[Sequence[int]],
    catalogue: SIDTrie | Mapping[Hashable, Sequence[int]],
    *,
    k: int = 10,
    num_beams: int | None = None,
    batch_size: int = 16,
    add_special_tokens: bool = False,
    strict: bool = True,
    show_progress: bool = False,
    targets: Sequence[Sequence[int]] | None = None,
    sid_softmax: SIDSoftmax = None,
    exclude: Sequence[Collection[Hashable]] | None = None,
) -> Recommendations:
    """Top-``k`` items for each prompt by constrained beam search (:func:`~.beam.constrained_beam_search`:
    greedy beam search, no length penalty, each prompt encoded once and no beam forward for the first SID
    token).

    Args:
        model: a causal LM (or a PEFT model wrapping one) with the SID tokens in its vocabulary.
        tokenizer: used to encode string prompts and for its pad token; may be ``None`` for id prompts.
        prompts: formatted prompts that end exactly where the SID starts (chat template and generation
            prompt included, as in training), or their token ids. Encoded with ``add_special_tokens``.
        catalogue: item id -> SID token ids (see :func:`sid_token_ids`), or a prebuilt :class:`SIDTrie`;
            SIDs of one length (every SID index gives them).
        k: items returned per prompt. num_beams: beam width, ``>= k`` (default ``k``).
        batch_size: prompts per forward batch (left padded; prompts are length-sorted to limit padding).
        strict: raise if any scored beam is not a valid, new item (the constraint guarantees none is).
        targets: optional, one complete SID (token ids) per prompt, also scored from the same prompt cache,
            in ``extra["target_nlls"]`` (one dict per prompt, as :func:`~.beam.target_nlls`).
        sid_softmax: normalise each step over the SID rows only (the SID-only softmax); None: as the
            model's adapter was trained (``sid_softmax``, recorded in its SID record), else the whole
            vocabulary; or the SID rows' token ids (a model whose adapter was merged away, see
            :data:`~.heads.SIDSoftmax`). Only the SID rows of the head are then computed.
        exclude: optional, one collection of item ids per prompt (e.g. the user's history) that the search
            never enters: no beam is spent on them (a prompt excluding all but ``n < k`` items gets ``n``).

    Returns:
        :class:`Recommendations`, items and scores best first; a score is the model's summed
        log-probability of the item's SID tokens given the prompt.
    """
    trie = catalogue if isinstance(catalogue, SIDTrie) else SIDTrie(catalogue)
    num_beams = k if num_beams is None else num_beams
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if num_beams < k:
        raise ValueError(
            f"num_beams={num_beams} is narrower than k={k}: beam search returns at most num_beams items; "
            f"pass num_beams >= {k}"
        )
    if k > len(trie):
        raise ValueError(f"k={k} exceeds the catalogue's {len(trie)} items; lower k")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if not trie.fixed_length:
        raise ValueError(
            f"the constrained beam search needs SIDs of one length, these have lengths {trie.lengths} (every "
            "SID index gives one length)"
        )
    head = StepHead.for_model(model, sid_softmax)
    encoded = _encode_prompts(tokenizer, prompts, add_special_tokens)
    if exclude is not None and len(exclude) != len(encoded):
        raise ValueError(f"{len(exclude)} exclusion sets for {len(encoded)} prompts: give one per prompt")
    if targets is not None:
        check_targets(targets, trie, len(encoded))
    pad_id = _pad_token_id(tokenizer, model)
    device = _input_device(model)

    result = Recommendations(
        items=[[] for _ in encoded], scores=[[] for _ in encoded], k=k, num_beams=num_beams
    )
    nlls: list[dict[str, float] | None] = [None] * len(encoded)
    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    if show_progress:
        from tqdm.auto import tqdm

        batches = tqdm(batches, desc="constrained beam search", unit="batch")
    with eval_mode(model), torch.no_grad():
        for batch in batches:
            input_ids, attention_mask = left_pad([encoded[i] for i in batch], pad_id, device)
            batch_targets = None
            if targets is not None:
                batch_targets = torch.tensor(
                    [list(targets[i]) for i in batch], dtype=torch.long, device=device
                )
            open_nodes = None
            if exclude is not None:
                open_nodes = trie.open_nodes([exclude[i] for i in batch], device)
            generated, scores, scored = constrained_beam_search(
                model,
                input_ids,
                attention_mask,
                trie,
                num_beams,
                batch_targets,
                head=head,
                open_nodes=open_nodes,
            )
            generated, scores = generated.cpu(), scores.cpu()
            for index, value in zip(batch, scored or (), strict=False):
                nlls[index] = value
            for row, index in enumerate(batch):
                _collect(result, index, trie, generated[row], scores[row])

    if targets is not None:
        result.extra["target_nlls"] = nlls
    bad = result.num_invalid + result.num_duplicate
    if strict and bad:
        raise RuntimeError(
            f"constrained decoding returned {result.num_invalid} invalid and {result.num_duplicate} duplicate "
            "beams; this is a bug in the SID constraint, please report it"
        )
    wanted = [k] * len(encoded)
    if exclude is not None:  # a prompt that excludes all but n < k items gets n
        wanted = [min(k, len(trie) - sum(i in trie for i in set(e))) for e in exclude]
    short = [i for i, items in enumerate(result.items) if len(items) < wanted[i]]
    if short:
        raise RuntimeError(
            f"{len(short)} prompts got fewer than k={k} distinct items (first: prompt {short[0]} with "
            f"{len(result.items[short[0]])}); this should not happen with num_beams >= k, please report it"
        )
    return result


# From users' histories to the model's beams: each history as the prompt the adapter was trained on, then the
# search over an index's trie (steps 1 and 2 of the served route, :func:`peft_grounded.serving.top_k_lists`).


def history_prompts(
    histories: Sequence[Sequence[str]], index: Any, tokenizer: Any, catalogue: Any = None, fmt: Any = None
) -> list[Any]:
    """The inference prompt of each history (item ids, oldest first) in prompt format ``fmt``."""
    from ..prompts import inference_prompts

    examples = [(str(u), list(h), None) for u, h in enumerate(histories)]
    return inference_prompts(examples, index, tokenizer, catalogue, fmt)[1]


def sid_trie(tokenizer: Any, index: Any) -> SIDTrie:
    """The trie of every item of ``index`` (its SIDs' token ids in ``tokenizer``)."""
    return SIDTrie(item_token_ids(tokenizer, index))


def model_beams(
    model: Any,
    tokenizer: Any,
    index: Any,
    histories: Sequence[Sequence[str]],
    beams: int,
    *,
    fmt: Any = None,
    catalogue: Any = None,
    trie: SIDTrie | None = None,
    sid_softmax: SIDSoftmax = None,
    batch_size: int = 32,
    exclude: Sequence[Sequence[str]] | None = None,
    targets: Sequence[Sequence[int]] | None = None,
    show_progress: bool = False,
) -> Recommendations:
    """The model's ``beams`` best items per history, best first (steps 1 and 2 of the served route): the beams
    a new-item rule mixes, or a list before it is cut to ``k``."""
    trie = sid_trie(tokenizer, index) if trie is None else trie
    return recommend(
        model,
        tokenizer,
        history_prompts(histories, index, tokenizer, catalogue, fmt),
        trie,
        k=beams,
        num_beams=beams,
        batch_size=batch_size,
        sid_softmax=sid_softmax,
        exclude=exclude,
        targets=targets,
        show_progress=show_progress,
    )


def _collect(
    result: Recommendations, index: int, trie: SIDTrie, beams: torch.Tensor, scores: torch.Tensor
) -> None:
    """Map one prompt's beams to items, best first, and update the counters."""
    if torch.isnan(scores).any():
        raise FloatingPointError("beam search produced NaN scores: the model's logits contain NaN")
    items, values, seen = result.items[index], result.scores[index], set()
    for beam in scores.argsort(descending=True, stable=True).tolist():
        result.num_beams_returned += 1
        score = float(scores[beam])
        if score <= FILLER_SCORE:
            result.num_filler += 1
            continue
        tokens = beams[beam].tolist()
        if trie.fixed_length:
            tokens = tokens[: trie.max_length]
        elif trie.end_token_id in tokens:
            tokens = tokens[: tokens.index(trie.end_token_id)]
        item = trie.item_of(tokens)
        if item is None:
            result.num_invalid += 1
        elif item in seen:
            result.num_duplicate += 1
        else:
            seen.add(item)
            if len(items) < result.k:
                items.append(item)
                values.append(score)


def _encode_prompts(
    tokenizer: Any, prompts: Sequence[str] | Sequence[Sequence[int]], add_special_tokens: bool
) -> list[list[int]]:
    if isinstance(prompts, str):
        raise TypeError("prompts must be a list of prompts, got a single string; wrap it in a list")
    encoded: list[list[int]] = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            if tokenizer is None:
                raise ValueError("string prompts need a tokenizer; pass one or pass token ids")
            ids = tokenizer(prompt, add_special_tokens=add_special_tokens)["input_ids"]
        elif isinstance(prompt, torch.Tensor):
            ids = prompt.flatten().tolist()
        else:
            ids = [int(t) for t in prompt]
        if not ids:
            raise ValueError(f"prompt {i} is empty: every prompt needs at least one token")
        encoded.append(list(ids))
    return encoded


def left_pad(
    sequences: list[list[int]], pad_id: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` of token-id lists padded on the left with ``pad_id`` (torch's
    ``pad_sequence``: any in-vocabulary id works, padded positions are masked; a tokenizer needs no pad token)."""
    from torch.nn.utils.rnn import pad_sequence

    rows = [torch.tensor(s, dtype=torch.long) for s in sequences]
    input_ids = pad_sequence(rows, batch_first=True, padding_value=pad_id, padding_side="left")
    attention_mask = pad_sequence(
        [torch.ones_like(r) for r in rows], batch_first=True, padding_value=0, padding_side="left"
    )
    return input_ids.to(device), attention_mask.to(device)


def _pad_token_id(tokenizer: Any, model: torch.nn.Module) -> int:
    """Any in-vocabulary id works: padded positions are masked out."""
    for source in (tokenizer, getattr(model, "config", None)):
        for name in ("pad_token_id", "eos_token_id"):
            value = getattr(source, name, None) if source is not None else None
            if isinstance(value, list):
                value = value[0] if value else None
            if value is not None:
                return int(value)
    return 0


def _input_device(model: torch.nn.Module) -> torch.device:
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if embeddings is not None and hasattr(embeddings, "weight"):
        return embeddings.weight.device
    return next(model.parameters()).device
