"""Recommendation SFT, the second training stage: next-item data (prompt or sequence objective), the trainer,
and distillation from a peer. Its settings (``RecommendationConfig``) live with every stage's in
:mod:`peft_grounded.training.stage_config`, its callbacks in :mod:`peft_grounded.training.callbacks`.

Names load on first use (:mod:`peft_grounded._imports`), so that the settings parse without the trainer.
"""

from __future__ import annotations

from ..._imports import lazy_exports

_LAZY = {  # module: the names it exports
    ".stage_config": "RecommendationConfig",
    "recommendation_trainer": "RecommendationTrainer train_recommender",
    ".callbacks": "ValidationLikelihood ValidationRecall learning_curve",
    "data": "recommendation_examples training_dataset sequence_dataset",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _LAZY)
