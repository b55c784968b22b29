"""The trainer core every stage shares: the stage settings (:mod:`.config`), an ``SFTTrainer`` that knows its
run (:mod:`.trainer`), the training clock of time budgets (:mod:`.clock`) and the run manifests and folder
layout (:mod:`.runs`).

``from peft_grounded.training import runs`` stays light; the trainer (TRL, torch) loads on first use of its
names.
"""

from __future__ import annotations

import importlib
from typing import Any

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


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
