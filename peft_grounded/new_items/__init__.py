"""New items: items added to a catalogue after the adapter was trained, served without retraining.

1. :func:`add_items` (:mod:`.grow_index`): a new version of a :class:`~peft_grounded.sids.SIDIndex` holding the
   new items, coded with the frozen codebooks; every existing SID stays bit for bit (``peft-grounded
   add-items``: :func:`add_items_to`).
2. :func:`grow_adapter` (:mod:`.adapter_rows`): a trained adapter onto the grown index; trained rows and LoRA
   carried over, the new tokens' rows started from their centroids (``peft-grounded grow-adapter``, whose
   function is :func:`peft_grounded.cli.growth.grow_adapter_into`).
3. :func:`ground_new_items` (:mod:`.row_training`): a few steps of grounding on the new items' text, training
   only the rows their SIDs use (``grow-adapter --ground``); :func:`tune_new_items_on_log`: the same rows
   trained on the interactions logged since training (``grow-adapter --log_steps``).
4. :class:`NewItemRule` (:mod:`.rule`): the rule stored with an adapter, fitted on the interactions logged
   since training, serving :class:`SemanticMixture` (:mod:`.mixture`, the calibrated two-expert mixture);
   ``recommend`` and ``evaluate`` serve it by one route (:func:`peft_grounded.serving.top_k_lists`).
5. :func:`new_item_beams` and :func:`choose_new_item_beams` (:mod:`.beams`): the model's searches the rule
   reads, over the new items alone, and the rule's choices on the log made with them.

The new-item protocol that measures them (which items are new, who is scored, the controls, the slot rule and
the stratified interval) is a benchmark's: ``benchmarks/new_item_protocol.py``, run by
``benchmarks/bench_grow_protocol.py``. Names load on first use.
"""

from __future__ import annotations

from .._imports import lazy_exports

_LAZY = {  # module: the names it exports
    "grow_index": "GrowthError GrowthReport add_items add_items_to add_vectors encoder_spec",
    "adapter_rows": "GROW_INITS check_lineage grow_adapter",
    "row_training": (
        "IncrementalGroundingConfig IncrementalResult ground_new_items held_out_log new_item_ids rows_used "
        "tune_new_items_on_log"
    ),
    "rule": "RULE_FILES NewItemRule NewItemRuleError calibration_pairs index_vectors rule_vectors",
    "mixture": "SemanticMixture",
    "beams": "choose_new_item_beams new_item_beams",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _LAZY)
