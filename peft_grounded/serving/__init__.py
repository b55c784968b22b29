"""Serving a trained grounded recommender: :class:`GroundedRecommender` (load from a folder or the Hub,
recommend for users' histories), the one route from a model to top-k lists (:func:`top_k_lists`, which
``evaluate`` measures with too) and the new-item rule stored with an adapter
(:class:`~peft_grounded.new_items.NewItemRule`)."""

from ..new_items.rule import NewItemRule, NewItemRuleError
from .loading import HistoryInputError, check_histories, read_histories
from .recommender import GroundedRecommender, UserRecommendations
from .top_k import top_k_lists

__all__ = [
    "GroundedRecommender",
    "HistoryInputError",
    "NewItemRule",
    "NewItemRuleError",
    "UserRecommendations",
    "check_histories",
    "read_histories",
    "top_k_lists",
]
