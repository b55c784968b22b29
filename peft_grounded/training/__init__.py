"""Training: the core every stage shares, and the two stages.

* :mod:`.config`: each stage's settings (``RunConfig``, ``GroundingConfig``, ``RecommendationConfig``);
* :mod:`.trainer`: ``RunTrainer``, an ``SFTTrainer`` that knows its run, and the body of a stage's entry point;
* :mod:`.steps`: what a step runs on (float32 attention and master weights, padding-free batches);
* :mod:`.callbacks`: the training clock of time budgets, validation likelihood and Recall, learning curves;
* :mod:`.runs`: a run on disk (manifest, checkpoints, adapter files);
* :mod:`.grounding`: the grounding stage (GTI); :mod:`peft_grounded.training.sft`: recommendation SFT.

Names load on first use of the package's exports, so that ``import peft_grounded.training`` stays light.
"""

from __future__ import annotations

from .._imports import lazy_exports

_LAZY = {  # module: the names it exports
    "stage_config": "RunConfig check_max_examples check_run_config",
    "trainer": "RunTrainer",
    "steps": "upcast_trainable",
    "runs": "save_adapter_atomic load_adapter_weights RunMismatchError sample_rows",
    "callbacks": "TrainingClock time_schedule",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _LAZY)
