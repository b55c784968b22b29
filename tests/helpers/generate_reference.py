"""transformers' own beam search with the SID constraint: the reference the package's engine is tested against.

The package serves one engine (:func:`peft_grounded.decoding.recommend`, :mod:`peft_grounded.decoding.beam`);
this is the ``generate`` path it replaced, kept here so that the tests (and the decoding benchmarks) compare the
served engine with transformers' beam search: :func:`generate_recommend` takes the arguments of
``recommend`` (plus ``end_token_id`` for SIDs of several lengths and ``prefix_cache``) and returns the same
:class:`~peft_grounded.decoding.Recommendations`.

The constraint goes into ``model.generate`` as a :class:`SIDConstraintLogitsProcessor`. The call is made
deterministic whatever the checkpoint ships: every ``generation_config`` held by the model (Instruct models turn
sampling, temperature, top-p, repetition penalties on) is swapped for a blank one for the duration of the call
(:func:`isolated_generation`), and an explicit greedy beam-search config is passed (:func:`beam_search_config`).
transformers' beam search takes ``log_softmax`` of the logits over the whole vocabulary and only then runs the
logits processors, so a beam's score is the model's log-probability of its SID tokens.
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from peft_grounded.decoding import Recommendations, SIDTrie
from peft_grounded.decoding.heads import SIDSoftmax, StepHead
from peft_grounded.decoding.search import (
    _collect,
    _encode_prompts,
    _input_device,
    _pad_token_id,
    left_pad,
)


class SIDConstraintLogitsProcessor(LogitsProcessor):
    """Sets to ``-inf`` every next token that does not extend a valid SID prefix.

    Stateless: each call walks the trie from the tokens generated so far (``input_ids[:, prompt_length:]``),
    so it does not depend on how beam search reorders its rows. When the trie has an ``end_token_id``
    (variable-length SIDs), a complete SID allows only that token, with score 0 so that the end marker does
    not change the ranking. With ``sid_ids`` (a model trained with the SID-only softmax) the scores are
    first renormalised over those token rows.
    """

    def __init__(self, trie: SIDTrie, prompt_length: int, sid_ids: torch.Tensor | None = None) -> None:
        if prompt_length < 1:
            raise ValueError(f"prompt_length must be >= 1, got {prompt_length}")
        self.trie = trie
        self.prompt_length = prompt_length
        self.sid_ids = sid_ids

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if input_ids.shape[1] < self.prompt_length:
            raise ValueError(
                f"input_ids have {input_ids.shape[1]} positions, fewer than prompt_length={self.prompt_length}"
            )
        self.trie.check_vocab_size(scores.shape[-1])
        if self.sid_ids is not None:  # the SID-only softmax: log-probabilities over the SID rows
            scores = scores - scores[:, self.sid_ids.to(scores.device)].logsumexp(-1, keepdim=True)
        nodes = self.trie.walk(input_ids[:, self.prompt_length :])
        rows, tokens = self.trie.allowed_pairs(nodes)
        constrained = torch.full_like(scores, float("-inf"))
        constrained[rows, tokens] = scores[rows, tokens]
        end = self.trie.end_token_id
        if end is not None:
            complete = self.trie.is_complete(nodes)
            constrained[:, end] = torch.where(complete, 0.0, float("-inf")).to(constrained.dtype)
        return constrained


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


def generate_recommend(
    model: torch.nn.Module,
    tokenizer: Any,
    prompts: Sequence[str] | Sequence[Sequence[int]],
    catalogue: SIDTrie | Mapping[Hashable, Sequence[int]],
    *,
    k: int = 10,
    num_beams: int | None = None,
    batch_size: int = 16,
    end_token_id: int | None = None,
    prefix_cache: bool = True,
    sid_softmax: SIDSoftmax = None,
) -> Recommendations:
    """Top-``k`` items per prompt by ``model.generate`` with the SID constraint (SIDs of one length, or of
    several ended by ``end_token_id``); ``prefix_cache``: encode each prompt once and repeat its KV cache to
    the beams instead of letting ``generate`` encode it ``num_beams`` times (the same result)."""
    trie = catalogue if isinstance(catalogue, SIDTrie) else SIDTrie(catalogue, end_token_id=end_token_id)
    num_beams = k if num_beams is None else num_beams
    if num_beams < k or k > len(trie):
        raise ValueError(f"k={k} needs num_beams >= k and at most the trie's {len(trie)} items")
    head = StepHead.for_model(model, sid_softmax)
    encoded = _encode_prompts(tokenizer, prompts, False)
    pad_id = _pad_token_id(tokenizer, model)
    eos = None if trie.fixed_length else trie.end_token_id
    config = beam_search_config(num_beams, trie.max_length + (eos is not None), pad_id, eos)
    device = _input_device(model)
    result = Recommendations(
        items=[[] for _ in encoded], scores=[[] for _ in encoded], k=k, num_beams=num_beams
    )
    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
    with isolated_generation(model), torch.no_grad():
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            input_ids, attention_mask = left_pad([encoded[i] for i in batch], pad_id, device)
            generated, scores = _generate(
                model, input_ids, attention_mask, trie, config, num_beams, prefix_cache, head.sid_ids
            )
            for row, index in enumerate(batch):
                _collect(result, index, trie, generated[row], scores[row])
    if result.num_invalid + result.num_duplicate:
        raise RuntimeError(
            f"generate returned {result.num_invalid} invalid, {result.num_duplicate} duplicate beams"
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
