"""The end-to-end demo and its presets."""

from .demo import PRESETS, Preset, load_summary, run_demo

__all__ = ["PRESETS", "Preset", "load_summary", "run_demo"]
