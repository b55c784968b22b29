"""Initialisations of new token rows, centroid projection, and the anchors of the lstsq projection."""

from .anchors import vocabulary_anchors, word_tokens
from .projection import PROJECTIONS, project_vectors
from .stats import VocabularyStats, vocabulary_stats
from .strategies import INITS, InitData, initial_rows

__all__ = [
    "INITS",
    "PROJECTIONS",
    "InitData",
    "VocabularyStats",
    "initial_rows",
    "project_vectors",
    "vocabulary_anchors",
    "vocabulary_stats",
    "word_tokens",
]
