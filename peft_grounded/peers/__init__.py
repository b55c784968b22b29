"""Recommenders a shop could run instead of the grounded LLM, scored on the same users and metrics.

* :class:`TextKNN`: cosine neighbours in the SID index's own item-vector space (no training);
* :class:`~.sasrec.SASRecRecommender`: SASRec with full-softmax cross-entropy, best epoch on validation;
* the most-popular ranking (:func:`peft_grounded.evaluation.popularity_users`);
* PEFT's own default path (:mod:`.base`), run by the experiment runner as strategy ``peft_default``.

:func:`peer_records` gives any peer's per-user records on the users the LLM evaluation scores, so that
:func:`peft_grounded.evaluation.compare_users` pairs them.
"""

from .base import Recommender, TextKNN, exclude_seen, peer_records, peer_results

__all__ = ["Recommender", "TextKNN", "exclude_seen", "peer_records", "peer_results"]
