"""Constrained decoding: beam search restricted to valid Semantic IDs, returning the top-K items."""

from .generation import Recommendations, beam_search_config, isolated_generation, recommend
from .new_items import mix_new_items
from .processor import SIDConstraintLogitsProcessor
from .sid_ids import sid_token_ids
from .trie import SIDTrie

__all__ = [
    "Recommendations",
    "SIDConstraintLogitsProcessor",
    "SIDTrie",
    "beam_search_config",
    "isolated_generation",
    "mix_new_items",
    "recommend",
    "sid_token_ids",
]
