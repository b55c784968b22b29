"""Evaluation: leave-one-out Recall@K / NDCG@K and target likelihood on all users and cold-item targets,
per-user records, paired bootstrap intervals, JSON and markdown. The lists are the served ones
(:func:`peft_grounded.serving.top_k_lists`); the new-item protocol lives in :mod:`peft_grounded.new_items`.

Names load on first use (:mod:`peft_grounded._imports`), so that the settings (:mod:`.metrics`) parse without
torch.
"""

from __future__ import annotations

from .._imports import lazy_exports

_LAZY = {  # module: the names it exports
    "metrics": (
        "DEFAULT_KS metric_names metric_value ndcg_at_k rank_metrics ranking_metrics recall_at_k "
        "target_rank EvalSettings"
    ),
    "evaluator": (
        "LIKELIHOOD_METRICS target_log_likelihood Evaluation evaluate evaluate_adapter evaluate_adapter_into"
    ),
    "reports": (
        "POPULARITY_LABEL evaluate_popularity popularity_users comparison_table evaluate_predictions "
        "evaluate_split markdown_table write_json write_markdown write_text_atomic compare_users "
        "intervals_table paired_intervals user_values"
    ),
    ".intervals": "bootstrap_interval",
    ".decoding.trie": "item_token_ids",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _LAZY)
