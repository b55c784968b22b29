"""Training time as a budget: a clock that pauses for evaluation, survives resumes and agrees across ranks.

:class:`TrainingClock` counts the seconds a run has spent training (evaluation done inside
:meth:`TrainingClock.paused` is left out, so strategies with and without validation points compare at
equal training time) and the item targets it has seen. Both are stored in every checkpoint (it is a
``transformers`` ``ExportableState``) and restored on resume. With ``minutes`` set it stops the run at
that training time; :func:`time_schedule` is then the learning-rate factor: linear warm-up over the
first ``warmup_ratio`` of the time, then linear decay to 0 at the time limit, so every budget ends its
schedule exactly when it stops (whatever the speed of the machine).

Under DDP/FSDP every rank reads rank 0's clock at the beginning of each step (one broadcast), so all
ranks use the same learning rate and stop at the same step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from tqdm.auto import tqdm
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState, ProgressCallback


def time_schedule(fraction: float, warmup_ratio: float) -> float:
    """Learning-rate factor at ``fraction`` of the time budget: linear warm-up, then linear decay to 0."""
    fraction = min(max(fraction, 0.0), 1.0)
    if warmup_ratio > 0 and fraction < warmup_ratio:
        return max(fraction / warmup_ratio, 1e-3)
    return max(0.0, (1.0 - fraction) / max(1.0 - warmup_ratio, 1e-9))


class TrainingClock(TrainerCallback, ExportableState):
    """Training seconds and item targets seen; stops the run after ``minutes`` of training when set."""

    def __init__(self, minutes: float | None = None, device: torch.device | str = "cpu") -> None:
        if minutes is not None and minutes <= 0:
            raise ValueError(f"minutes={minutes}: a time budget must be positive (or None for none).")
        self.minutes, self.device = minutes, device
        self.restored_seconds = 0.0
        self.items = 0
        self.now = 0.0  # rank 0's training seconds at the beginning of the current step
        self._start: float | None = None
        self._paused = 0.0
        # set by the trainer: adds the item targets counted since the last call to ``items`` (on every rank)
        self.flush: Callable[[], None] | None = None

    def items_now(self) -> int:
        """Item targets seen so far, this step's included (call it on every rank: it may reduce)."""
        if self.flush is not None:
            self.flush()
        return self.items

    # -- time
    def elapsed(self) -> float:
        """Training seconds of this run so far (this process's clock), resumes included."""
        if self._start is None:
            return self.restored_seconds
        return self.restored_seconds + time.perf_counter() - self._start - self._paused

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Leave what runs inside (evaluation) out of the training time."""
        t = time.perf_counter()
        try:
            yield
        finally:
            self._paused += time.perf_counter() - t

    def fraction(self) -> float:
        """Share of the time budget used (0 without a budget)."""
        return min(self.now / (self.minutes * 60), 1.0) if self.minutes else 0.0

    # -- callback
    def on_train_begin(self, args, state, control, **kwargs):
        saved = (state.stateful_callbacks or {}).get(type(self).__name__) if state.global_step else None
        attributes = saved.get("attributes", {}) if isinstance(saved, dict) else {}
        self.restored_seconds = float(attributes.get("seconds", 0.0))
        self.items = int(attributes.get("items", 0))
        self._start, self._paused = time.perf_counter(), 0.0
        self.now = self.restored_seconds
        return control

    def on_step_begin(self, args, state, control, **kwargs):
        self.now = self._shared(self.elapsed())
        return control

    def on_step_end(self, args, state, control, **kwargs):
        if self.minutes is not None and self.now >= self.minutes * 60:
            control.should_training_stop = True
        if control.should_save or control.should_training_stop:
            self.items_now()  # the checkpoint stores the count up to this step
        return control

    def _shared(self, seconds: float) -> float:
        """Rank 0's value on every rank (a no-op in one process)."""
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return seconds
        if torch.distributed.get_world_size() == 1:
            return seconds
        value = torch.tensor([seconds], dtype=torch.float64, device=self.device)
        torch.distributed.broadcast(value, src=0)
        return float(value.item())

    def state(self) -> dict:
        return {
            "args": {"minutes": self.minutes},
            "attributes": {"seconds": self.elapsed(), "items": self.items},
        }


class TimeProgressCallback(ProgressCallback):
    """The training progress bar of a time-budgeted run: seconds of the budget, not steps (whose count a
    time budget leaves open), with the step count as postfix."""

    def __init__(self, clock: TrainingClock) -> None:
        super().__init__()
        self.clock = clock

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            total = max(1, round(self.clock.minutes * 60)) if self.clock.minutes else None
            self.training_bar = tqdm(total=total, unit="s", dynamic_ncols=True, desc="training time")
            self.training_bar.update(min(round(self.clock.now), total or 0))
        self.current_step = state.global_step

    def on_step_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero and self.training_bar is not None:
            seconds = round(self.clock.elapsed())
            bar = self.training_bar
            bar.update(max(0, min(seconds, bar.total or seconds) - bar.n))
            bar.set_postfix(step=state.global_step, refresh=False)
        self.current_step = state.global_step
