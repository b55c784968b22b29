"""Constrained decoding: beam search restricted to valid Semantic IDs, returning the top-K items (one engine,
:func:`recommend`; the route from users' histories to served lists is :func:`peft_grounded.serving.top_k_lists`)."""

from .search import Recommendations, recommend
from .sid_ids import sid_token_ids
from .trie import SIDTrie

__all__ = ["Recommendations", "SIDTrie", "recommend", "sid_token_ids"]
