"""The grounding stage (GTI): paired text <-> SID data and a TRL trainer that moves only the new rows.

Names load on first use (:mod:`peft_grounded._lazy`), so that the settings (:mod:`.config`) parse without the
trainer.
"""

from __future__ import annotations

from .._lazy import lazy_exports

_LAZY = {
    "DEFAULT_TEMPLATES": "data",
    "GroundingConfig": "config",
    "GroundingData": "data",
    "GroundingTemplate": "data",
    "GroundingTrainer": "trainer",
    "ground": "trainer",
    "grounding_dataset": "data",
    "grounding_examples": "data",
}

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
