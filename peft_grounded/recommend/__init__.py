"""Recommendation SFT: next-item examples, the trainer, and the runner that compares initialisations."""

from .data import recommendation_examples, training_dataset
from .runner import STRATEGIES, Budget, Experiment, Strategy, run_strategy
from .trainer import RecommendationConfig, RecommendationTrainer, ValidationRecall, train_recommender

__all__ = [
    "STRATEGIES",
    "Budget",
    "Experiment",
    "RecommendationConfig",
    "RecommendationTrainer",
    "Strategy",
    "ValidationRecall",
    "recommendation_examples",
    "run_strategy",
    "train_recommender",
    "training_dataset",
]
