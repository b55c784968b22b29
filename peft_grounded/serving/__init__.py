"""Serving a trained grounded recommender: :class:`GroundedRecommender` (load from a folder or the Hub,
recommend for users' histories) and the new-item rule stored with an adapter (:class:`NewItemRule`)."""

from .histories import HistoryInputError, check_histories, read_histories
from .new_item_rule import NewItemRule, NewItemRuleError
from .recommender import GroundedRecommender, UserRecommendations

__all__ = [
    "GroundedRecommender",
    "HistoryInputError",
    "NewItemRule",
    "NewItemRuleError",
    "UserRecommendations",
    "check_histories",
    "read_histories",
]
