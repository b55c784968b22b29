"""Recommendation SFT: next-item examples, the trainer, and the runner that compares initialisations."""

from .data import HistoryError, PromptFormat, inference_prompts, recommendation_examples, training_dataset
from .model import load_base, sid_model
from .runner import STRATEGIES, Budget, Experiment, Strategy, run_strategy
from .trainer import RecommendationConfig, RecommendationTrainer, ValidationRecall, train_recommender

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
    "load_base",
    "recommendation_examples",
    "run_strategy",
    "sid_model",
    "train_recommender",
    "training_dataset",
]
