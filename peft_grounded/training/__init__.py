"""The trainer core every stage shares: the stage settings (:mod:`.config`), an ``SFTTrainer`` that knows its
run (:mod:`.trainer`), the training clock of time budgets (:mod:`.clock`) and the run manifests and folder
layout (:mod:`.runs`).

``from peft_grounded.training import runs`` stays light; the trainer (TRL, torch) loads on first use of its
names.
"""

from __future__ import annotations

from .._lazy import lazy_exports

_LAZY = {  # module: the names it exports
    "config": "RunConfig check_max_examples check_run_config",
    "trainer": "RunTrainer upcast_trainable",
    "adapter_files": "save_adapter_atomic load_adapter_weights",
    "clock": "TrainingClock time_schedule",
    "runs": "RunMismatchError sample_rows",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _LAZY)
