"""Evaluation: leave-one-out Recall@K / NDCG@K on all users and cold-item targets, JSON and markdown."""

from .evaluate import (
    comparison_table,
    evaluate_predictions,
    evaluate_recommender,
    evaluate_split,
    markdown_table,
    write_json,
    write_markdown,
    write_text_atomic,
)
from .likelihood import LIKELIHOOD_METRICS, evaluate_likelihood, target_log_likelihood
from .metrics import DEFAULT_KS, metric_names, ndcg_at_k, ranking_metrics, recall_at_k, target_rank
from .users import (
    POPULARITY_LABEL,
    EvalSettings,
    evaluate_adapter,
    evaluate_model,
    evaluate_popularity,
    item_token_ids,
)

__all__ = [
    "DEFAULT_KS",
    "LIKELIHOOD_METRICS",
    "POPULARITY_LABEL",
    "EvalSettings",
    "comparison_table",
    "evaluate_adapter",
    "evaluate_likelihood",
    "evaluate_model",
    "evaluate_popularity",
    "evaluate_predictions",
    "evaluate_recommender",
    "evaluate_split",
    "item_token_ids",
    "markdown_table",
    "metric_names",
    "ndcg_at_k",
    "ranking_metrics",
    "recall_at_k",
    "target_log_likelihood",
    "target_rank",
    "write_json",
    "write_markdown",
    "write_text_atomic",
]
