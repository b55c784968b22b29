"""Evaluation: leave-one-out Recall@K / NDCG@K and target likelihood on all users and cold-item targets,
per-user records, paired bootstrap intervals, JSON and markdown."""

from .evaluator import Evaluation, evaluate, evaluate_adapter, evaluate_adapter_into
from .intervals import bootstrap_interval, compare_users, intervals_table, paired_intervals, user_values
from .likelihood import LIKELIHOOD_METRICS, target_log_likelihood
from .metrics import (
    DEFAULT_KS,
    metric_names,
    metric_value,
    ndcg_at_k,
    rank_metrics,
    ranking_metrics,
    recall_at_k,
    target_rank,
)
from .new_items import calibration_pairs, first_seen, new_item_examples
from .reports import (
    comparison_table,
    evaluate_predictions,
    evaluate_split,
    markdown_table,
    write_json,
    write_markdown,
    write_text_atomic,
)
from .settings import EvalSettings
from .users import (
    POPULARITY_LABEL,
    evaluate_popularity,
    item_token_ids,
    popularity_users,
)

__all__ = [
    "DEFAULT_KS",
    "LIKELIHOOD_METRICS",
    "POPULARITY_LABEL",
    "EvalSettings",
    "Evaluation",
    "bootstrap_interval",
    "calibration_pairs",
    "compare_users",
    "comparison_table",
    "evaluate",
    "evaluate_adapter",
    "evaluate_adapter_into",
    "evaluate_popularity",
    "evaluate_predictions",
    "evaluate_split",
    "first_seen",
    "intervals_table",
    "item_token_ids",
    "markdown_table",
    "metric_names",
    "metric_value",
    "ndcg_at_k",
    "new_item_examples",
    "paired_intervals",
    "popularity_users",
    "rank_metrics",
    "ranking_metrics",
    "recall_at_k",
    "target_log_likelihood",
    "target_rank",
    "user_values",
    "write_json",
    "write_markdown",
    "write_text_atomic",
]
