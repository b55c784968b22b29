"""The grounding stage (GTI): paired text <-> SID data and a TRL trainer that moves only the new rows.

Names load on first use (:mod:`peft_grounded._lazy`), so that the settings (:mod:`.config`) parse without the
trainer.
"""

from __future__ import annotations

from .._lazy import lazy_exports

_LAZY = {  # module: the names it exports
    "data": "DEFAULT_TEMPLATES GroundingData GroundingTemplate grounding_dataset grounding_examples",
    "config": "GroundingConfig",
    "trainer": "GroundingTrainer ground",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _LAZY)
