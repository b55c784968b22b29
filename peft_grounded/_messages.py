"""Helpers for error messages that stay readable whatever the input's size."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def listed(names: Sequence[Any], most: int = 10) -> str:
    """``names`` for a message: the first ``most``, then how many more (a file can have thousands)."""
    shown = ", ".join(repr(n) for n in list(names)[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")
