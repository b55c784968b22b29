"""Growing a catalogue: new items after training, without retraining, in one place.

1. :func:`add_items` (:mod:`.index`, the codes in :mod:`.grounding`): a new version of a
   :class:`~peft_grounded.sids.SIDIndex` holding the new items, coded with the frozen codebooks; every existing
   SID stays bit for bit (``peft-grounded add-items``: :func:`add_items_to`).
2. :func:`grow_adapter` (:mod:`.adapter`): a trained adapter onto the grown index; trained rows and LoRA carried
   over, the new tokens' rows started from their centroids (``peft-grounded grow-adapter``).
3. :func:`ground_new_items` (:mod:`.grounding`): a few steps of grounding on the new items' text, training only
   the rows their SIDs use (``grow-adapter --ground``); :func:`grow_adapter_into` (:mod:`.adapter`) is the
   ``grow-adapter`` command as a function.
4. Serving the new items: the new-item rule fitted on the interactions logged since training
   (``grow-adapter --interactions``) lives with the rest of the new-item logic in
   :mod:`peft_grounded.new_items`; ``recommend`` and ``evaluate`` serve it by one route
   (:func:`peft_grounded.serving.top_k_lists`).

Heavy dependencies load on first use of the names that need them.
"""

from __future__ import annotations

from .._imports import lazy_exports

_LAZY = {  # module: the names it exports
    "index": "GrowthError GrowthReport add_items add_items_to add_vectors encoder_spec",
    "adapter": "GROW_INITS check_lineage grow_adapter grow_adapter_into",
    "grounding": (
        "IncrementalGroundingConfig IncrementalResult ground_new_items new_item_ids rows_used tune_new_items_on_log"
    ),
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _LAZY)
