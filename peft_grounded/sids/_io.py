"""Atomic file writes (the package-wide implementation, :mod:`peft_grounded._io`)."""

from __future__ import annotations

from .._io import atomic_write

__all__ = ["atomic_write"]
