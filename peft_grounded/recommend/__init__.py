"""Recommendation SFT: next-item data (prompt or sequence objective), the trainer and its training callbacks."""

from .callbacks import ValidationLikelihood, ValidationRecall, learning_curve
from .data import recommendation_examples, training_dataset
from .sequence import sequence_dataset
from .trainer import RecommendationConfig, RecommendationTrainer, train_recommender

__all__ = [
    "RecommendationConfig",
    "RecommendationTrainer",
    "ValidationLikelihood",
    "ValidationRecall",
    "learning_curve",
    "recommendation_examples",
    "sequence_dataset",
    "train_recommender",
    "training_dataset",
]
