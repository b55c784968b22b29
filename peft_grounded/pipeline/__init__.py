"""The experiment across stages: the strategy runner, the end-to-end demo and its presets."""

from .demo import PRESETS, Preset, load_summary, run_demo
from .runner import STRATEGIES, Budget, Experiment, Strategy, run_strategy

__all__ = [
    "PRESETS",
    "STRATEGIES",
    "Budget",
    "Experiment",
    "Preset",
    "Strategy",
    "load_summary",
    "run_demo",
    "run_strategy",
]
