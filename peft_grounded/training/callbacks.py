"""The trainer's callbacks: the training clock of time budgets, validation likelihood and Recall, learning curves.

Training time as a budget: a clock that pauses for evaluation, survives resumes and agrees across ranks.

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

import logging
import math
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState, ProgressCallback

from ..adapter.saved import ADAPTER_WEIGHTS
from .runs import load_adapter_weights, save_adapter_atomic


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


# Learning curves: the progressive loss and a held-out validation measure every N steps, per run.
#
# Both live in the trainer's ``state.log_history`` (which checkpoints store, so a resumed run keeps the
# points logged before its checkpoint):
#
# * every training-loss log carries ``seconds`` (training time), ``items_seen`` (item targets so far) and
#   ``item_nll`` (the window's mean NLL per item target, see :class:`~peft_grounded.training.RunTrainer`);
#   in the first epoch each window's targets are ones the model has not trained on yet, so these points
#   are the *progressive* loss, a held-out measure for free;
# * :class:`ValidationLikelihood` adds ``valid_nll`` / ``valid_constrained_nll`` of a fixed seeded sample of
#   validation users every ``every`` steps; :class:`ValidationRecall` adds beam-search Recall/NDCG.
#
# :func:`learning_curve` turns a log history into ``{"train": [...], "valid": [...]}`` (``curve.json``).
#
# Several processes (DDP, FSDP): every rank evaluates the same users, so every rank takes part in each
# forward (FSDP gathers its shards in collectives: an evaluation on rank 0 alone would hang) and all ranks
# log the same numbers. The evaluation time is paused out of the run's training clock.

logger = logging.getLogger(__name__)

VALID_PREFIX = "valid_"
RECALL_PREFIX = "eval_"


class _PeriodicEvaluation(TrainerCallback):
    """Every ``every`` optimisation steps, or ``per_epoch`` times an epoch (every ``steps per epoch //
    per_epoch`` steps, so ``per_epoch=1`` is each epoch's end), ``evaluate(model)`` -> metrics logged with
    ``prefix``; ``evaluate(model, tokenizer)`` with ``with_tokenizer`` (the trainer's ``processing_class``, for
    a caller that did not load the model itself)."""

    prefix = ""
    wants_clock = True  # RunTrainer hands it its TrainingClock, so evaluation is not counted as training

    def __init__(
        self, evaluate: Callable[..., dict], every: int, with_tokenizer: bool = False, per_epoch: int = 0
    ) -> None:
        if every < 0 or per_epoch < 0 or (every and per_epoch):
            raise ValueError(
                f"every={every}, per_epoch={per_epoch}: evaluate every N >= 1 steps or M >= 1 times an epoch "
                "(one of them), or neither for never."
            )
        self.evaluate, self.every, self.with_tokenizer = evaluate, every, with_tokenizer
        self.per_epoch = per_epoch
        self.clock: Any = None
        self.tokenizer: Any = None

    def _due(self, state) -> bool:
        return bool(self.every) and state.global_step > 0 and state.global_step % self.every == 0

    def on_train_begin(self, args, state, control, processing_class=None, train_dataloader=None, **kwargs):
        self.tokenizer = processing_class
        if self.per_epoch:
            if train_dataloader is None:
                raise ValueError("per_epoch needs the trainer's train_dataloader to count an epoch's steps")
            steps = math.ceil(len(train_dataloader) / max(1, args.gradient_accumulation_steps))
            self.every = max(1, steps // self.per_epoch)
        return control

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self._due(state):
            self._log_point(state, model)
        return control

    def _log_point(self, state, model) -> dict:
        """Evaluate ``model`` now (training clock paused) and append the point to the log history."""
        with self.clock.paused() if self.clock is not None else nullcontext():
            metrics = self.evaluate(model, self.tokenizer) if self.with_tokenizer else self.evaluate(model)
        entry = {"step": state.global_step, **{f"{self.prefix}{k}": v for k, v in metrics.items()}}
        if self.clock is not None:
            entry |= {"seconds": round(self.clock.elapsed(), 3), "items_seen": self.clock.items_now()}
        state.log_history.append(entry)
        return entry


class ValidationLikelihood(_PeriodicEvaluation):
    """Every ``every`` steps, the validation users' target NLL (``valid_nll``, ``valid_constrained_nll``)."""

    prefix = VALID_PREFIX


class ValidationRecall(_PeriodicEvaluation):
    """Every ``every`` steps, decode the validation prompts and log Recall@K / NDCG@K (``eval_recall@5``...).

    ``curve`` holds the points, those logged before a resumed checkpoint included. ``keep_best`` (a metric
    name, e.g. ``"recall@10"``): training ends with the adapter of the evaluation where it was highest (early
    stopping on validation, as transformers' ``load_best_model_at_end``): each new best is saved, atomically,
    to ``directory/step-N`` (by the main process); at the end of training the last weights are evaluated too
    (unless their step was a validation point) and the best of all is loaded back (before the trainer writes
    its adapter) and logged (``restored_best_step``). A resumed run keeps the snapshot its checkpoint's
    log knows and drops those of the steps it trains again. Not with FSDP or DeepSpeed (sharded weights)."""

    prefix = RECALL_PREFIX

    def __init__(
        self,
        evaluate: Callable[[Any], dict],
        every: int,
        keep_best: str | None = None,
        directory: str | Path | None = None,
        with_tokenizer: bool = False,
        per_epoch: int = 0,
    ) -> None:
        super().__init__(evaluate, every, with_tokenizer, per_epoch)
        if keep_best is not None and ((not every and not per_epoch) or directory is None):
            raise ValueError(
                f"keep_best={keep_best!r} needs validation points (every >= 1 or per_epoch >= 1, got {every} and "
                f"{per_epoch}) and a directory for the best adapter"
            )
        self.curve: list[dict] = []
        self.keep_best = keep_best
        self.directory = Path(directory) if directory is not None else None
        self.best: tuple[int, float] | None = None  # (step, value)

    def on_train_begin(self, args, state, control, **kwargs):
        super().on_train_begin(args, state, control, **kwargs)
        self.curve = [_strip(e, self.prefix) for e in state.log_history if _has(e, "eval_recall@")]
        if self.keep_best is not None:
            self._recover(args, state)
        return control

    def on_step_end(self, args, state, control, model=None, **kwargs):
        before = len(state.log_history)
        control = super().on_step_end(args, state, control, model=model, **kwargs)
        points = [_strip(e, self.prefix) for e in state.log_history[before:]]
        self.curve.extend(points)
        if self.keep_best is not None:
            for point in points:
                self._consider(args, point, model)
        return control

    def on_train_end(self, args, state, control, model=None, **kwargs):
        if self.keep_best is None:
            return control
        if state.global_step > 0 and not any(p["step"] == state.global_step for p in self.curve):
            # the last weights are a candidate too (a budget rarely ends on a validation step): evaluated
            # here, and kept live when they win (no snapshot needed)
            point = _strip(self._log_point(state, model), self.prefix)
            self.curve.append(point)
            value = point.get(self.keep_best)
            if value is not None and (self.best is None or value > self.best[1]):
                self.best = (state.global_step, value)
        if self.best is None:
            return control
        step, value = self.best
        if step != state.global_step:
            load_adapter_weights(model, self._snapshot(step))
        state.log_history.append(
            {"step": state.global_step, "restored_best_step": step, f"restored_best_{self.keep_best}": value}
        )
        logger.info("keep_best: the adapter of step %d (validation %s %.4f)", step, self.keep_best, value)
        return control

    def finish_stopped_run(self, args, state, model, processing_class=None) -> None:
        """A run resumed after its last step (killed before its adapter was written): what training's begin
        and end would do, so that it too ends with the best adapter."""
        from transformers import TrainerControl

        self.on_train_begin(args, state, TrainerControl(), processing_class=processing_class)
        self.on_train_end(args, state, TrainerControl(), model=model)

    def _snapshot(self, step: int) -> Path:
        assert self.directory is not None
        return self.directory / f"step-{step}"

    def _recover(self, args, state) -> None:
        """The best point of the (resumed) log whose snapshot is on disk; the other snapshots removed."""
        if getattr(args, "fsdp", None) or getattr(args, "deepspeed", None):
            raise ValueError(
                "keep_best saves the best adapter from the live weights, which FSDP and DeepSpeed shard: train "
                "without it there (and pick a checkpoint by the logged validation curve)"
            )
        self.best = None
        for point in self.curve:
            value = point.get(self.keep_best)
            fresh = self.best is None or (value is not None and value > self.best[1])
            if value is not None and fresh and (self._snapshot(point["step"]) / ADAPTER_WEIGHTS).is_file():
                self.best = (point["step"], value)
        if args.should_save:  # a step trained again, an older best, or a killed write's leftovers
            self._remove_all_but(None if self.best is None else self.best[0])

    def _consider(self, args, point: dict, model) -> None:
        if self.keep_best not in point:
            raise KeyError(
                f"keep_best={self.keep_best!r} is not among the validation metrics ({', '.join(sorted(point))})"
            )
        value = point[self.keep_best]
        if self.best is not None and value <= self.best[1]:
            return
        self.best = (point["step"], value)
        if args.should_save:  # the earlier bests stay until a checkpoint holds this one's log (on_save)
            with self.clock.paused() if self.clock is not None else nullcontext():
                save_adapter_atomic(model, self._snapshot(point["step"]))

    def on_save(self, args, state, control, **kwargs):
        if self.keep_best is not None and self.best is not None and args.should_save:
            self._remove_all_but(self.best[0])  # a resume from this checkpoint knows the best point
        return control

    def _remove_all_but(self, step: int | None) -> None:
        """Every snapshot (and any leftover of a killed write) but ``step``'s."""
        if self.directory is not None and self.directory.is_dir():
            keep = None if step is None else self._snapshot(step).name
            for old in self.directory.iterdir():
                if old.name != keep:
                    shutil.rmtree(old, ignore_errors=True)


class LogHistory(TrainerCallback):
    """Keeps the trainer's log history at the end of training, on every rank (the ``log_history.json``
    file is written by the main process only, so other ranks must not read it back)."""

    def __init__(self) -> None:
        self.entries: list[dict] = []

    def on_train_end(self, args, state, control, **kwargs):
        self.entries = [dict(e) for e in state.log_history]
        return control


def _has(entry: dict, prefix: str) -> bool:
    return "step" in entry and any(k.startswith(prefix) for k in entry)


def _strip(entry: dict, prefix: str) -> dict:
    return {"step": entry["step"], **{k[len(prefix) :]: v for k, v in entry.items() if k.startswith(prefix)}}


def learning_curve(log_history: list[dict]) -> dict[str, list[dict]]:
    """``{"train": [...], "valid": [...]}`` from a trainer's log history.

    ``train`` points: ``step, epoch, seconds, items_seen, loss`` (mean per SID token), ``item_nll`` (per
    item target) and ``progressive`` (True in the first epoch: the window's targets were unseen).
    ``valid`` points: ``step, seconds, items_seen, nll, constrained_nll, uniform_nll, users``.
    """
    train, valid = [], []
    for entry in log_history:
        if "loss" in entry and "step" in entry:
            point = {k: entry.get(k) for k in ("step", "epoch", "seconds", "items_seen", "loss", "item_nll")}
            train.append(point | {"progressive": (entry.get("epoch") or 0) <= 1.0})
        elif _has(entry, VALID_PREFIX):
            point = {k: entry.get(k) for k in ("step", "seconds", "items_seen")}
            valid.append(point | _strip(entry, VALID_PREFIX))
    return {"train": train, "valid": valid}
