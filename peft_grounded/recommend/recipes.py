"""Named recipes for ``peft-grounded sft --recipe NAME``: defaults for the flags that the flags given (and a
``--config`` file) override.

``cpu``: the recipe chosen on validation per CPU minute (BENCHMARKS.md, "A recipe chosen on validation"), the
demo's default preset: the first 8 of the base's decoder blocks, the sequence objective over 19 items of
history with the SID-only softmax (the default wherever it applies), the centroid start pulled to a tenth of its
spread around the vocabulary mean, a rank-8 LoRA, learning rate 3e-3, batches of 8 windows of at most 128
tokens. The budget (``--max_minutes`` or ``--max_steps``) stays the user's.

``build-sids --recipe cpu``: the SIDs this recipe was chosen with, 3 levels of 64 codes, built from behaviour
(SASRec's item embeddings of the training split; the text map for items with few interactions), which beat
the text SIDs on validation (BENCHMARKS.md, "Levers against the peers").
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

# flag destinations (the settings dataclasses' field names) -> values
RECIPES: MappingProxyType[str, MappingProxyType[str, Any]] = MappingProxyType(
    {
        "cpu": MappingProxyType(
            {
                "layers": 8,
                "objective": "sequence",
                "max_history": 19,
                "init": "centroid",
                "init_scale": 0.1,
                "lora_r": 8,
                "lora_alpha": 16,
                "learning_rate": 3e-3,
                "per_device_train_batch_size": 8,
                "max_length": 128,
            }
        ),
    }
)

# build-sids: flag destinations -> values
SID_RECIPES: MappingProxyType[str, MappingProxyType[str, Any]] = MappingProxyType(
    {
        "cpu": MappingProxyType(
            {"levels": 3, "codes": "64", "item_vectors": "behaviour", "behaviour_minutes": 1.0}
        )
    }
)
