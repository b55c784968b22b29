"""Evaluation: leave-one-out Recall@K / NDCG@K and target likelihood on all users and cold-item targets,
per-user records, paired bootstrap intervals, JSON and markdown.

Names load on first use (:mod:`peft_grounded._lazy`), so that the settings (:mod:`.settings`) parse without
torch.
"""

from __future__ import annotations

from .._lazy import lazy_exports

_LAZY = {
    "DEFAULT_KS": "metrics",
    "LIKELIHOOD_METRICS": "likelihood",
    "POPULARITY_LABEL": "users",
    "EvalSettings": "settings",
    "Evaluation": "evaluator",
    "bootstrap_interval": "intervals",
    "calibration_pairs": "new_items",
    "compare_users": "intervals",
    "comparison_table": "reports",
    "evaluate": "evaluator",
    "evaluate_adapter": "evaluator",
    "evaluate_adapter_into": "evaluator",
    "evaluate_popularity": "users",
    "evaluate_predictions": "reports",
    "evaluate_split": "reports",
    "first_seen": "new_items",
    "intervals_table": "intervals",
    "item_token_ids": "users",
    "markdown_table": "reports",
    "metric_names": "metrics",
    "metric_value": "metrics",
    "ndcg_at_k": "metrics",
    "new_item_examples": "new_items",
    "paired_intervals": "intervals",
    "popularity_users": "users",
    "rank_metrics": "metrics",
    "ranking_metrics": "metrics",
    "recall_at_k": "metrics",
    "target_log_likelihood": "likelihood",
    "target_rank": "metrics",
    "user_values": "intervals",
    "write_json": "reports",
    "write_markdown": "reports",
    "write_text_atomic": "reports",
}

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
