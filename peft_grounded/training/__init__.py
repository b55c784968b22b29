"""The trainer core every stage shares: the stage settings (:mod:`.config`), an ``SFTTrainer`` that knows its
run (:mod:`.trainer`), the training clock of time budgets (:mod:`.clock`) and the run manifests and folder
layout (:mod:`.runs`).

``from peft_grounded.training import runs`` stays light; the trainer (TRL, torch) loads on first use of its
names.
"""

from __future__ import annotations

from .._lazy import lazy_exports

_LAZY = {
    "RunConfig": "config",
    "check_max_examples": "config",
    "check_run_config": "config",
    "RunTrainer": "trainer",
    "save_adapter_atomic": "adapter_files",
    "load_adapter_weights": "adapter_files",
    "upcast_trainable": "trainer",
    "sample_rows": "trainer",
    "TrainingClock": "clock",
    "time_schedule": "clock",
    "RunMismatchError": "runs",
}

__all__ = list(_LAZY)


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
