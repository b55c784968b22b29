"""Run small CPU tensor work on one thread: with several, thread wake-ups dominate small ops (and on a
loaded machine make them many times slower)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def one_thread(device: torch.device | str | None = None) -> Iterator[None]:
    """Within the block, torch uses one CPU thread (a no-op for other devices)."""
    if device is not None and torch.device(device).type != "cpu":
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
