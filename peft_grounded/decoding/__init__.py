"""Constrained decoding: beam search restricted to valid Semantic IDs, returning the top-K items (one engine,
:func:`recommend`; the route from users' histories to served lists is :func:`peft_grounded.serving.top_k_lists`)."""

from .search import Recommendations, recommend
from .trie import SIDTrie, sid_token_ids

__all__ = ["Recommendations", "SIDTrie", "recommend", "sid_token_ids"]
