"""Recommendation SFT: next-item examples, the trainer, and the runner that compares initialisations."""

from .data import HistoryError, PromptFormat, inference_prompts, recommendation_examples, training_dataset
from .runner import STRATEGIES, Budget, Experiment, Strategy, run_strategy
from .trainer import RecommendationConfig, RecommendationTrainer, ValidationRecall

__all__ = [
    "STRATEGIES",
    "Budget",
    "Experiment",
    "HistoryError",
    "PromptFormat",
    "RecommendationConfig",
    "RecommendationTrainer",
    "Strategy",
    "ValidationRecall",
    "inference_prompts",
    "recommendation_examples",
    "run_strategy",
    "training_dataset",
]
