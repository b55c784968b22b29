"""Recommendation SFT: next-item data (prompt or sequence objective), the trainer and its training callbacks.

Names load on first use (:mod:`peft_grounded._lazy`), so that the settings (:mod:`.config`) parse without the
trainer.
"""

from __future__ import annotations

from .._lazy import lazy_exports

_LAZY = {  # module: the names it exports
    "config": "RecommendationConfig",
    "trainer": "RecommendationTrainer train_recommender",
    "callbacks": "ValidationLikelihood ValidationRecall learning_curve",
    "data": "recommendation_examples training_dataset",
    "sequence": "sequence_dataset",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _LAZY)
