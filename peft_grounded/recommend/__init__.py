"""Recommendation SFT: next-item data (prompt or sequence objective), the trainer and its training callbacks.

Names load on first use (:mod:`peft_grounded._lazy`), so that the settings (:mod:`.config`) parse without the
trainer.
"""

from __future__ import annotations

from .._lazy import lazy_exports

_LAZY = {
    "RecommendationConfig": "config",
    "RecommendationTrainer": "trainer",
    "ValidationLikelihood": "callbacks",
    "ValidationRecall": "callbacks",
    "learning_curve": "callbacks",
    "recommendation_examples": "data",
    "sequence_dataset": "sequence",
    "train_recommender": "trainer",
    "training_dataset": "data",
}

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
