"""The experiment across stages: the strategy runner, the end-to-end demo and its presets."""

from .budget import STRATEGIES, Budget, Experiment, Strategy, strategy
from .demo import PRESETS, Preset, load_summary, run_demo
from .runner import run_strategy

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
    "strategy",
]
