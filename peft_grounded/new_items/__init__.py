"""New items (added to a SID index after the adapter was trained) in users' lists, in one place.

* :mod:`.rule`: :class:`NewItemRule`, the rule stored with an adapter and served by ``recommend`` and
  ``evaluate`` (both through :func:`peft_grounded.serving.top_k_lists`), fitted on the interactions logged
  since training;
* :mod:`.mixture`: :class:`SemanticMixture`, the calibrated two-expert mixture the rule serves;
* :mod:`.protocol`: TIGER's slot rule (:func:`mix_new_items`) and random slots, the earlier rule and its control;
* :mod:`.protocol`: the new-item protocol's data side (which items are new, who is scored, what was logged);
* :mod:`.protocol`: the protocol's controls of the served rule and its all-users stratified interval.

``benchmarks/bench_grow_protocol.py`` runs the protocol with them. Names load on first use.
"""

from __future__ import annotations

from .._imports import lazy_exports

_LAZY = {  # module: the names it exports
    "rule": "RULE_FILES NewItemRule NewItemRuleError calibration_pairs index_vectors rule_vectors",
    "mixture": "SemanticMixture",
    "protocol": (
        "default_match_levels mix_new_items random_slots first_seen full_histories logged_pairs "
        "new_item_examples P_TEXT TEXT_ONLY blended control_lists p_text_lists text_knn_beams"
    ),
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _LAZY)
