"""Atomic file writes (the package-wide implementation, :mod:`peft_grounded._io`)."""

from __future__ import annotations

import os
from pathlib import Path

from peft_grounded._io import atomic_write, atomic_write_text

__all__ = ["atomic_write_bytes", "atomic_write_text"]


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` so that readers see either the old file or the whole new one."""
    return atomic_write(path, data)
