"""Top-K item recommendation by beam search constrained to valid Semantic IDs.

The constraint goes into ``model.generate`` as a :class:`SIDConstraintLogitsProcessor`; the beam search is
transformers' own. The call is made deterministic whatever the checkpoint ships: every ``generation_config``
held by the model (Instruct models turn sampling, temperature, top-p, repetition penalties on) is swapped
for a blank one for the duration of the call, and an explicit greedy beam-search config is passed.
"""

from __future__ import annotations

import warnings
from collections.abc import Collection, Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessorList

from .beam import constrained_beam_search
from .heads import SIDSoftmax, StepHead
from .processor import SIDConstraintLogitsProcessor
from .trie import SIDTrie, check_targets

ENGINES = ("auto", "fast", "generate")

FILLER_SCORE = -1e8
"""Beams scoring below this are beam-search padding (transformers starts extra beams at -1e9), not items."""


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


def beam_search_config(
    num_beams: int, max_new_tokens: int, pad_token_id: int, eos_token_id: int | None
) -> GenerationConfig:
    """A deterministic beam-search config: no sampling, no penalties, raw summed log-probs as scores."""
    return GenerationConfig(
        do_sample=False,
        num_beams=num_beams,
        num_return_sequences=num_beams,
        max_new_tokens=max_new_tokens,
        min_length=0,
        length_penalty=0.0,
        early_stopping=False,
        repetition_penalty=1.0,
        encoder_repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        encoder_no_repeat_ngram_size=0,
        renormalize_logits=False,
        remove_invalid_values=False,
        use_cache=True,
        output_scores=True,
        return_dict_in_generate=True,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
    )


@contextmanager
def isolated_generation(model: torch.nn.Module) -> Iterator[None]:
    """Within the block: eval mode, and a blank ``generation_config`` on every module that holds one.

    ``generate`` fills each unset field of the config it is given from ``model.generation_config``, so fields
    whose neutral value is ``None`` (``bad_words_ids``, ``suppress_tokens``, ``forced_eos_token_id``, ...)
    cannot be neutralised by the config passed in; blanking the model's own config can. Everything is
    restored on exit. PEFT wrappers are covered: they read the wrapped model's config.
    """
    holders = [m for m in model.modules() if "generation_config" in vars(m)]
    saved = [(m, m.generation_config) for m in holders]
    was_training = model.training
    try:
        for module in holders:
            module.generation_config = GenerationConfig()
        model.eval()
        yield
    finally:
        for module, config in saved:
            module.generation_config = config
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
    end_token_id: int | None = None,
    add_special_tokens: bool = False,
    prefix_cache: bool = True,
    strict: bool = True,
    show_progress: bool = False,
    engine: str = "auto",
    targets: Sequence[Sequence[int]] | None = None,
    sid_softmax: SIDSoftmax = None,
    exclude: Sequence[Collection[Hashable]] | None = None,
) -> Recommendations:
    """Top-``k`` items for each prompt by constrained beam search.

    Args:
        model: a causal LM (or a PEFT model wrapping one) with the SID tokens in its vocabulary.
        tokenizer: used to encode string prompts and for its pad token; may be ``None`` for id prompts.
        prompts: formatted prompts that end exactly where the SID starts (chat template and generation
            prompt included, as in training), or their token ids. Encoded with ``add_special_tokens``.
        catalogue: item id -> SID token ids (see :func:`sid_token_ids`), or a prebuilt :class:`SIDTrie`.
        k: items returned per prompt. num_beams: beam width, ``>= k`` (default ``k``).
        batch_size: prompts per ``generate`` call (left padded; prompts are length-sorted to limit padding).
        end_token_id: token that ends a SID when SIDs have different lengths (ignored when they do not).
        prefix_cache: encode each prompt once and copy its KV cache to the beams, instead of letting
            ``generate`` encode every prompt ``num_beams`` times (same result, far less prefill compute).
        strict: raise if any scored beam is not a valid, new item (the constraint guarantees none is).
        engine: ``"fast"`` (:func:`~.beam.constrained_beam_search`: the same search with the prompt encoded
            once per user and no beam forward for the first SID token; fixed-length SIDs only),
            ``"generate"`` (transformers' ``generate`` with the SID logits processor), or ``"auto"``
            (``fast`` when the SIDs have one length, else ``generate``).
        targets: optional, one complete SID (token ids) per prompt: the fast engine then also scores it
            from the same prompt cache, in ``extra["target_nlls"]`` (one dict per prompt, as
            :func:`~.scoring.target_nlls`). Needs the fast engine.
        sid_softmax: normalise each step over the SID rows only (the SID-only softmax); None: as the
            model's adapter was trained (``sid_softmax_loss``, recorded in its metadata), else the whole
            vocabulary; or the SID rows' token ids (a model whose adapter was merged away, see
            :data:`~.heads.SIDSoftmax`). The fast engine then computes only the SID rows of the head.
        exclude: optional, one collection of item ids per prompt (e.g. the user's history) that the search
            never enters: no beam is spent on them (the fast engine; a prompt excluding all but ``n < k``
            items gets ``n``).

    Returns:
        :class:`Recommendations`, items and scores best first; a score is the model's summed
        log-probability of the item's SID tokens given the prompt.
    """
    trie = catalogue if isinstance(catalogue, SIDTrie) else SIDTrie(catalogue, end_token_id=end_token_id)
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
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine == "auto":
        engine = "fast" if trie.fixed_length else "generate"
    if engine == "fast" and not trie.fixed_length:
        raise ValueError(
            f"engine='fast' needs SIDs of one length, these have lengths {trie.lengths}; use engine='generate'"
        )
    if exclude is not None and engine != "fast":
        raise ValueError("exclude (items the search never enters) needs engine='fast' (SIDs of one length)")
    head = StepHead.for_model(model, sid_softmax)
    encoded = _encode_prompts(tokenizer, prompts, add_special_tokens)
    if exclude is not None and len(exclude) != len(encoded):
        raise ValueError(f"{len(exclude)} exclusion sets for {len(encoded)} prompts: give one per prompt")
    if targets is not None:
        if engine != "fast":
            raise ValueError("scoring targets during decoding needs engine='fast' (SIDs of one length)")
        check_targets(targets, trie, len(encoded))
    pad_id = _pad_token_id(tokenizer, model)
    eos = None if trie.fixed_length else trie.end_token_id
    config = beam_search_config(num_beams, trie.max_length + (eos is not None), pad_id, eos)
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
    with isolated_generation(model), torch.no_grad():
        for batch in batches:
            input_ids, attention_mask = left_pad([encoded[i] for i in batch], pad_id, device)
            if engine == "fast":
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
            else:
                generated, scores = _generate(
                    model, input_ids, attention_mask, trie, config, num_beams, prefix_cache, head.sid_ids
                )
            if trie.fixed_length and generated.shape[-1] != trie.max_length:
                raise RuntimeError(
                    f"generate returned {generated.shape[-1]} new tokens per beam, not the SID length "
                    f"{trie.max_length}; a custom stopping criterion or generate override interfered"
                )
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


def _generate(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    trie: SIDTrie,
    config: GenerationConfig,
    num_beams: int,
    prefix_cache: bool,
    sid_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens [prompts, num_beams, new tokens], scores [prompts, num_beams])`` from ``model.generate``
    (``sid_ids``: each step renormalised over those rows)."""
    processor = SIDConstraintLogitsProcessor(trie, prompt_length=input_ids.shape[1], sid_ids=sid_ids)
    cache = _prompt_cache(model, input_ids, attention_mask, num_beams) if prefix_cache else {}
    output = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        generation_config=config,
        logits_processor=LogitsProcessorList([processor]),
        **cache,
    )
    prompts = input_ids.shape[0]
    generated = output.sequences[:, input_ids.shape[1] :].view(prompts, num_beams, -1).cpu()
    return generated, output.sequences_scores.view(prompts, num_beams).float().cpu()


def _prompt_cache(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, num_beams: int
) -> dict[str, Any]:
    """KV cache of all prompt tokens but the last, computed once per prompt and repeated for each beam.

    ``generate`` then only runs the last prompt token; positions follow the left padding as in
    ``generate``. Returns ``{}`` (plain ``generate``, with a warning naming the cause) when the model's
    forward rejects these arguments or its cache cannot be repeated.
    """
    if input_ids.shape[1] < 2:
        return {}
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    try:
        output = model(
            input_ids=input_ids[:, :-1],
            attention_mask=attention_mask[:, :-1],
            position_ids=position_ids[:, :-1],
            use_cache=True,
            logits_to_keep=1,
        )
    except TypeError as err:  # a forward lacking one of these arguments: let generate encode, but say so
        warnings.warn(
            f"prefix cache disabled: the model's forward rejected the cached prompt call ({err}); every "
            "prompt is encoded once per beam, which is much slower. Pass prefix_cache=False to silence this.",
            RuntimeWarning,
            stacklevel=3,
        )
        return {}
    for name in ("cache", "past_key_values"):  # the attribute was renamed during transformers 5.x
        cache = getattr(output, name, None)
        if cache is not None and hasattr(cache, "batch_repeat_interleave"):
            cache.batch_repeat_interleave(num_beams)
            return {name: cache}
    warnings.warn(
        f"prefix cache disabled: the model returned no repeatable KV cache ({type(output).__name__}); every "
        "prompt is encoded once per beam. Pass prefix_cache=False to silence this.",
        RuntimeWarning,
        stacklevel=3,
    )
    return {}


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
