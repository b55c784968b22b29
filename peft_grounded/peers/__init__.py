"""Recommenders a shop could run instead of the grounded LLM, scored on the same users and metrics."""
