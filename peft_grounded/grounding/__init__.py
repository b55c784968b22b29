"""The grounding stage (GTI): paired text <-> SID data and a TRL trainer that moves only the new rows."""

from .data import DEFAULT_TEMPLATES, GroundingData, GroundingTemplate, grounding_dataset, grounding_examples
from .trainer import GroundingConfig, GroundingTrainer, ground

__all__ = [
    "DEFAULT_TEMPLATES",
    "GroundingConfig",
    "GroundingData",
    "GroundingTemplate",
    "GroundingTrainer",
    "ground",
    "grounding_dataset",
    "grounding_examples",
]
