"""The strategies a comparison runs: how the new rows start (an initialisation), optionally grounded."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Strategy:
    """How the new rows start: an initialisation, optionally followed by grounding."""

    name: str
    init: str
    ground: bool = False
    description: str = ""
    # None: a grounded adapter; "peft": PEFT's own LoraConfig(trainable_token_indices=...), the baseline
    adapter: str | None = None


STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy(
            "mean", "mean", description="every new row = the vocabulary mean (the GTI paper's baseline)"
        ),
        Strategy(
            "gaussian",
            "gaussian",
            description="draws from N(mean, cov) of the vocabulary (the centroid paper's baseline)",
        ),
        Strategy("random", "random", description="the model's initialiser, N(0, initializer_range)"),
        Strategy("centroid", "centroid", description="SID-region centroids, projected and mean-shifted"),
        Strategy("gti", "mean", ground=True, description="mean init, then grounding (GTI)"),
        Strategy(
            "centroid_gti",
            "centroid",
            ground=True,
            description="centroid init, then grounding (neither paper ran it)",
        ),
        Strategy(
            "peft_default",
            "mean",
            adapter="peft",
            description="without this package: mean_resizing + PEFT's LoraConfig(trainable_token_indices)",
        ),
    )
}


def strategy(name: str) -> Strategy:
    if name not in STRATEGIES:
        raise ValueError(f"Unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}.")
    return STRATEGIES[name]
