"""Recommendation SFT: next-item data (prompt or sequence objective), the trainer, learning curves, and the
runner that compares initialisations."""

from .curves import ValidationLikelihood, ValidationRecall, learning_curve
from .data import recommendation_examples, training_dataset
from .runner import STRATEGIES, Budget, Experiment, Strategy, run_strategy
from .sequence import sequence_dataset
from .trainer import RecommendationConfig, RecommendationTrainer, train_recommender

__all__ = [
    "STRATEGIES",
    "Budget",
    "Experiment",
    "RecommendationConfig",
    "RecommendationTrainer",
    "Strategy",
    "ValidationLikelihood",
    "ValidationRecall",
    "learning_curve",
    "recommendation_examples",
    "run_strategy",
    "sequence_dataset",
    "train_recommender",
    "training_dataset",
]
