"""Learning curves: the progressive loss and a held-out validation measure every N steps, per run.

Both live in the trainer's ``state.log_history`` (which checkpoints store, so a resumed run keeps the
points logged before its checkpoint):

* every training-loss log carries ``seconds`` (training time), ``items_seen`` (item targets so far) and
  ``item_nll`` (the window's mean NLL per item target, see :class:`~peft_grounded.training.RunTrainer`);
  in the first epoch each window's targets are ones the model has not trained on yet, so these points
  are the *progressive* loss, a held-out measure for free;
* :class:`ValidationLikelihood` adds ``valid_nll`` / ``valid_constrained_nll`` of a fixed seeded sample of
  validation users every ``every`` steps; :class:`ValidationRecall` adds beam-search Recall/NDCG.

:func:`learning_curve` turns a log history into ``{"train": [...], "valid": [...]}`` (``curve.json``).

Several processes (DDP, FSDP): every rank evaluates the same users, so every rank takes part in each
forward (FSDP gathers its shards in collectives: an evaluation on rank 0 alone would hang) and all ranks
log the same numbers. The evaluation time is paused out of the run's training clock.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from transformers import TrainerCallback

VALID_PREFIX = "valid_"
RECALL_PREFIX = "eval_"


class _PeriodicEvaluation(TrainerCallback):
    """Every ``every`` optimisation steps, ``evaluate(model)`` -> metrics logged with ``prefix``."""

    prefix = ""
    wants_clock = True  # RunTrainer hands it its TrainingClock, so evaluation is not counted as training

    def __init__(self, evaluate: Callable[[Any], dict], every: int) -> None:
        if every < 0:
            raise ValueError(f"every={every}: evaluate every N >= 1 steps, or 0 for never.")
        self.evaluate, self.every = evaluate, every
        self.clock: Any = None

    def _due(self, state) -> bool:
        return bool(self.every) and state.global_step > 0 and state.global_step % self.every == 0

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if not self._due(state):
            return control
        with self.clock.paused() if self.clock is not None else nullcontext():
            metrics = self.evaluate(model)
        entry = {"step": state.global_step, **{f"{self.prefix}{k}": v for k, v in metrics.items()}}
        if self.clock is not None:
            entry |= {"seconds": round(self.clock.elapsed(), 3), "items_seen": self.clock.items_now()}
        state.log_history.append(entry)
        return control


class ValidationLikelihood(_PeriodicEvaluation):
    """Every ``every`` steps, the validation users' target NLL (``valid_nll``, ``valid_constrained_nll``)."""

    prefix = VALID_PREFIX


class ValidationRecall(_PeriodicEvaluation):
    """Every ``every`` steps, decode the validation prompts and log Recall@K / NDCG@K (``eval_recall@5``...).

    ``curve`` holds the points, those logged before a resumed checkpoint included."""

    prefix = RECALL_PREFIX

    def __init__(self, evaluate: Callable[[Any], dict], every: int) -> None:
        super().__init__(evaluate, every)
        self.curve: list[dict] = []

    def on_train_begin(self, args, state, control, **kwargs):
        self.curve = [_strip(e, self.prefix) for e in state.log_history if _has(e, "eval_recall@")]
        return control

    def on_step_end(self, args, state, control, model=None, **kwargs):
        before = len(state.log_history)
        control = super().on_step_end(args, state, control, model=model, **kwargs)
        self.curve.extend(_strip(e, self.prefix) for e in state.log_history[before:])
        return control


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
