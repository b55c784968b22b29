"""The SID constraint as a transformers ``LogitsProcessor``.

transformers' beam search takes ``log_softmax`` of the logits over the whole vocabulary and only then runs
the logits processors, so after this processor a beam's score is the model's true log-probability of its
SID tokens (not renormalised over the allowed tokens): that is the quantity the ranking is defined by.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor

from .trie import SIDTrie


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
