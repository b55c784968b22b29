"""A training run on disk: its manifest (so that a resume never continues another run's checkpoints), its
checkpoints (written and resumed without loss) and its adapter files.

A manifest (``run.json`` in the output directory) records the facts that define a run: the stage, the
model, the new tokens and their initialisation, the data and the hyper-parameters that shape the
optimisation. Starting a run in a directory that holds another run's checkpoints, or resuming from a
checkpoint whose manifest differs, raises an error that names the differing fields; nothing on disk is
touched before that check.

Below the manifests: the checkpoints (:class:`SafeCheckpoints`) and the stage's adapter files
(:func:`save_adapter_atomic`, :func:`load_adapter_weights`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path
from typing import Any

from peft import PeftModel
from transformers.trainer_callback import TrainerState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, TrainOutput, rotate_checkpoints

from .._io import (
    TRL_CARD_MARKER,
    DiskFullError,
    atomic_write_text,
    is_disk_full,
    is_generated_card,
    make_temp_dir,
    read_json,
    swap_dir_into_place,
)
from ..adapter.layer import wrapped_keys
from ..adapter.saved import ADAPTER_WEIGHTS
from ..sids.extended_base import save_sid_record

# The layout of a run's folder (every stage and tool names its files from here)
MANIFEST = "run.json"  # what the run is (checked on resume)
ADAPTER_DIR = "adapter"  # a stage's final adapter
LOG_FILE = "log_history.json"  # a stage's loss log
RESULTS_FILE = "metrics.json"  # the strategy runner's results
CURVE_FILE = "curve.json"  # the strategy runner's learning curves per stage
STAGES = ("init", "grounding", "sft")  # the strategy runner's stage folders, in order
TRAINER_STATE = "trainer_state.json"  # written last by transformers into a checkpoint
# what a checkpoint holds its weights in (PEFT adapters, full models)
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin", "model.safetensors", "pytorch_model.bin")


class RunMismatchError(ValueError):
    """The checkpoints on disk belong to another run or configuration."""


def fingerprint(value: Any) -> str:
    """Short sha256 of a JSON-serialisable value (key order does not matter)."""
    text = json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def write_json_atomic(path: str | Path, value: Any) -> None:
    """Write JSON to ``path`` through a temporary file in the same directory (never a half-written file)."""
    atomic_write_text(path, json.dumps(value, indent=2, sort_keys=True, default=str) + "\n")


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: value}


def _differences(old: dict, new: dict) -> list[str]:
    """``key: old -> new`` for every (nested) field that differs, comparing values as stored in JSON."""
    old, new = _flatten(old), _flatten(json.loads(json.dumps(new, default=str)))
    keys = sorted(set(old) | set(new))
    return [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in keys if old.get(k) != new.get(k)]


def checkpoints(output_dir: str | Path) -> list[Path]:
    """The ``checkpoint-N`` directories of ``output_dir``, oldest first."""
    directory = Path(output_dir)
    found = [p for p in directory.glob("checkpoint-*") if p.is_dir() and p.name.split("-")[-1].isdigit()]
    return sorted(found, key=lambda p: int(p.name.split("-")[-1]))


def checkpoint_problem(checkpoint: str | Path) -> str | None:
    """Why ``checkpoint`` cannot be resumed from (a kill or a full disk during its write), or None.

    A complete checkpoint holds its weights, a readable ``trainer_state.json`` and the run manifest."""
    checkpoint = Path(checkpoint)
    if not any((checkpoint / name).is_file() for name in WEIGHT_FILES):
        return "no weights file"
    state = checkpoint / TRAINER_STATE
    if not state.is_file():
        return f"no {TRAINER_STATE}"
    try:
        json.loads(state.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, OSError):
        return f"a truncated {TRAINER_STATE}"
    if not (checkpoint / MANIFEST).is_file():
        return f"no {MANIFEST}"
    return None


def last_complete_checkpoint(output_dir: str | Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest checkpoint of ``output_dir`` that can be resumed from, and the newer, incomplete ones
    (each with what it lacks), which ``transformers`` would otherwise pick."""
    incomplete = []
    for checkpoint in reversed(checkpoints(output_dir)):
        problem = checkpoint_problem(checkpoint)
        if problem is None:
            return checkpoint, incomplete
        incomplete.append((checkpoint, problem))
    return None, incomplete


def check_manifest(source: Path, manifest: dict) -> None:
    """Raise :class:`RunMismatchError` unless the manifest file ``source`` records ``manifest``."""
    if not source.is_file():
        raise RunMismatchError(
            f"{source.parent} holds checkpoints without a {MANIFEST}: they were not written by this run. "
            "Choose an empty output directory."
        )
    recorded = read_json(source, fix="move the folder away and start the run in a new output directory")
    diff = _differences(recorded, manifest) if isinstance(recorded, dict) else ["(not a run manifest)"]
    if diff:
        raise RunMismatchError(
            f"{source.parent} belongs to another run or configuration; differing fields: "
            + "; ".join(diff)
            + ". Resume with the same settings, or start the new run in another output directory "
            "(the existing checkpoints were left untouched)."
        )


def check_and_write(output_dir: str | Path, manifest: dict, resume_from: str | Path | None) -> None:
    """Refuse to mix runs, then record ``manifest`` in ``output_dir`` (and nothing else)."""
    check_run(output_dir, manifest, resume_from)
    write_json_atomic(Path(output_dir) / MANIFEST, manifest)


def check_run(output_dir: str | Path, manifest: dict, resume_from: str | Path | None) -> None:
    """Raise :class:`RunMismatchError` if ``output_dir`` or ``resume_from`` holds another run; reads only.

    Distributed trainers call it on every rank (only the main one writes), so that a refusal stops every
    process instead of leaving the others waiting in a collective.
    """
    output_dir = Path(output_dir)
    sources = []
    if resume_from is not None:
        sources.append(Path(resume_from) / MANIFEST)
    if checkpoints(output_dir):
        sources.append(output_dir / MANIFEST)
    for source in sources:
        check_manifest(source, manifest)


def sample_rows(dataset, n: int | None, seed: int):
    """A seeded sample of ``n`` rows (all rows when ``n`` is None or larger than the dataset)."""
    from .stage_config import check_max_examples

    check_max_examples(n)
    if n is None or n >= len(dataset):
        return dataset
    return dataset.shuffle(seed=seed).select(range(n))


def dataset_fingerprint(dataset) -> str:
    """A content hash of the rows, the same in every process and ``datasets`` version (large datasets fall
    back to ``datasets``' own fingerprint)."""
    if dataset is None:
        return "none"
    if len(dataset) <= 200_000:
        return fingerprint(dataset.to_list())
    return str(getattr(dataset, "_fingerprint", len(dataset)))


# How a training run's checkpoints are written and resumed without loss.
#
# * every checkpoint is written into ``.checkpoint-N.partial`` and renamed into place when complete, so a kill or
#   a full disk at any instant leaves the last complete checkpoint; a resume skips (and moves aside) an
#   incomplete checkpoint (written otherwise, or damaged since), saying so;
# * resuming a finished run is a no-op that says so (the adapter and the log are left as they are);
# * TRL's draft model card does not replace a ``README.md`` of the user's in the output folder.
#
# :class:`SafeCheckpoints` is the part of :class:`~.trainer.RunTrainer` that does it (a mixin over
# ``transformers.Trainer``'s checkpoint hooks).

logger = logging.getLogger(__name__)

PARTIAL = ".partial"  # suffix of a checkpoint being written (``.checkpoint-N.partial``)
INCOMPLETE = ".incomplete"  # suffix of an incomplete checkpoint moved aside on resume
LEFTOVER_PATTERNS = (  # what a killed run of this trainer can leave behind, all of it its own
    f".{PREFIX_CHECKPOINT_DIR}-*{PARTIAL}",
    f".{ADAPTER_DIR}.*",
    f".{MANIFEST}.*.tmp",
    f".{LOG_FILE}.*.tmp",
)


def remove_leftovers(output_dir: Path) -> list[str]:
    """Delete the temporary files and folders a killed run left in ``output_dir``; returns their names."""
    removed = []
    for pattern in LEFTOVER_PATTERNS:
        for path in output_dir.glob(pattern):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed.append(path.name)
    return removed


def check_own_file(path: Path, expected: type, what: str) -> None:
    """Refuse to replace ``path`` unless it is this trainer's own ``what`` (a JSON ``expected``)."""
    if not path.exists():
        return
    try:
        ours = isinstance(json.loads(path.read_text(encoding="utf-8")), expected)
    except (json.JSONDecodeError, UnicodeDecodeError, OSError):
        ours = False
    if not ours:
        raise RunMismatchError(
            f"{path} is not a {what} a peft_grounded trainer wrote, and training would replace it. Move it "
            "away, or choose another output directory (nothing was changed)."
        )


class SafeCheckpoints:
    """Checkpoints written atomically, resumes that skip incomplete ones, finished runs left as they are.

    Mixed into :class:`~.trainer.RunTrainer` before ``SFTTrainer``; it uses the trainer's ``manifest``,
    ``_staging`` (the ``.partial`` folder being written) and ``_card_kept``.
    """

    # --- resuming --------------------------------------------------------------------------------------

    def _finished(self, output_dir: Path) -> bool:
        """Whether ``output_dir`` holds this run, finished (its adapter is written last); another run's
        adapter raises :class:`~peft_grounded.training.runs.RunMismatchError`."""
        if not (output_dir / ADAPTER_DIR / ADAPTER_WEIGHTS).is_file():
            return False
        check_manifest(output_dir / MANIFEST, self.manifest)
        return True

    def _already_finished(self, output_dir: Path) -> TrainOutput:
        """Resuming a finished run: load its adapter into the model, leave every file as it is."""
        adapter = output_dir / ADAPTER_DIR
        load_adapter_weights(self.model, adapter)
        log = output_dir / LOG_FILE
        history = json.loads(log.read_text()) if log.is_file() else []
        steps = [entry["step"] for entry in history if isinstance(entry, dict) and "step" in entry]
        self.state.log_history = history
        self.state.global_step = max(steps, default=0)
        logger.warning(
            "%s holds this run finished (step %d): nothing to resume; %s was left as it was and loaded",
            output_dir,
            self.state.global_step,
            adapter,
        )
        return TrainOutput(self.state.global_step, train_loss(self.state), {"already_finished": True})

    def _last_complete(self, output_dir: Path, move_aside: bool) -> str | None:
        """The last checkpoint a resume can use; newer incomplete ones are reported (and moved aside by the
        main process, out of ``transformers``' sight)."""
        if not output_dir.is_dir():
            logger.info("%s holds no checkpoint yet: starting the run from the beginning", output_dir)
            return None
        last, incomplete = last_complete_checkpoint(output_dir)
        for checkpoint, problem in incomplete:
            aside = checkpoint.with_name(f".{checkpoint.name}{INCOMPLETE}")
            if move_aside:
                shutil.rmtree(aside, ignore_errors=True)
                checkpoint.rename(aside)
            logger.warning(
                "%s is incomplete (%s: a kill or a full disk during its write); moved aside to %s. Resuming "
                "from %s instead.",
                checkpoint,
                problem,
                aside.name,
                last.name if last is not None else "the beginning (no complete checkpoint)",
            )
        if last is None and not incomplete:
            logger.info("%s holds no checkpoint yet: starting the run from the beginning", output_dir)
        return None if last is None else str(last)

    # --- checkpoints -----------------------------------------------------------------------------------

    def _get_output_dir(self, trial):
        """Where ``transformers`` writes checkpoints: the ``.partial`` folder while one is being written."""
        return str(self._staging) if self._staging is not None else super()._get_output_dir(trial)

    def _save_checkpoint(self, model, trial) -> None:
        """Write the checkpoint into ``.checkpoint-N.partial`` (with the run manifest), then rename it to
        ``checkpoint-N``: a kill or a full disk at any instant leaves the previous checkpoints complete."""
        root = Path(super()._get_output_dir(trial))
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        staging = root / f".{name}{PARTIAL}"
        main = self.args.should_save
        if main:
            shutil.rmtree(staging, ignore_errors=True)
        self.accelerator.wait_for_everyone()
        self._staging = staging
        try:
            # wrapped_keys: accelerate's FSDP2 save pairs state_dict() with named_parameters() (see adapter.layer)
            with wrapped_keys():
                super()._save_checkpoint(model, trial)  # rotates within the staging folder: nothing to delete
            self.accelerator.wait_for_everyone()  # every rank wrote its part (RNG states, shards)
            if main:
                self._publish(staging / name, root / name)
        except Exception as err:
            if main:
                shutil.rmtree(staging, ignore_errors=True)
            if is_disk_full(err):
                last, _ = last_complete_checkpoint(root)
                kept = (
                    f"the last complete checkpoint, {last.name}, is kept"
                    if last
                    else "no checkpoint is complete yet"
                )
                raise DiskFullError(
                    f"no space to write checkpoint {root / name} ({err}); the partial checkpoint was removed and "
                    f"{kept}. Free disk space, then resume (--resume_from_checkpoint / resume_from_checkpoint=True).",
                    err,
                ) from err
            raise
        finally:
            self._staging = None
        if main:
            shutil.rmtree(staging, ignore_errors=True)
            rotate_checkpoints(
                output_dir=str(root),
                save_total_limit=self.args.save_total_limit,
                best_model_checkpoint=self.state.best_model_checkpoint,
                use_mtime=True,
            )

    def _publish(self, written: Path, final: Path) -> None:
        """Record the manifest in the written checkpoint, point its paths at ``final``, and rename it there."""
        write_json_atomic(written / MANIFEST, self.manifest)
        best = self.state.best_model_checkpoint
        if best is not None and Path(best).parent == written.parent:  # set while the .partial folder was used
            self.state.best_model_checkpoint = str(final.parent / Path(best).name)
            state_file = written / TRAINER_STATE
            if state_file.is_file():
                self.state.save_to_json(str(state_file))
        if final.exists():  # a copy of this step already there (e.g. an incomplete one): replaced as a whole
            swap_dir_into_place(written, final)
        else:
            written.rename(final)

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        """TRL's draft card, unless ``README.md`` in the output folder is the user's (then it is kept)."""
        readme = Path(self.args.output_dir) / "README.md"
        if readme.exists() and not is_generated_card(readme, TRL_CARD_MARKER):
            if not self._card_kept and self.is_world_process_zero():
                logger.warning(
                    "%s is not a card TRL wrote: kept as it is (TRL's draft card is not written)", readme
                )
            self._card_kept = True
            return None
        return super().create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags)


def checkpoint_state(checkpoint: str | None) -> TrainerState | None:
    if checkpoint is None:
        return None
    path = Path(checkpoint) / TRAINER_STATE
    return TrainerState.load_from_json(str(path)) if path.is_file() else None


def stopped(state: TrainerState) -> bool:
    """Whether the checkpoint was written at the end of training (its step limit, or a time budget)."""
    if state.max_steps and state.max_steps > 0 and state.global_step >= state.max_steps:
        return True
    control = (state.stateful_callbacks or {}).get("TrainerControl")
    control = control[-1] if isinstance(control, list) and control else control
    return bool(isinstance(control, dict) and control.get("args", {}).get("should_training_stop"))


def train_loss(state: TrainerState) -> float:
    losses = [entry["loss"] for entry in state.log_history if isinstance(entry, dict) and "loss" in entry]
    return float(sum(losses) / len(losses)) if losses else float("nan")


# A stage's adapter on disk: written atomically (a temporary sibling folder swapped in), read back into a live
# adapter of the same structure.


def save_adapter_atomic(model: PeftModel, directory: str | Path, state_dict: dict | None = None) -> Path:
    """``model.save_pretrained(directory)`` and its SID record through a temporary sibling directory, swapped in
    at the end (``state_dict``: the weights to take them from, e.g. gathered from shards)."""
    directory = Path(directory)
    tmp = make_temp_dir(directory)
    try:
        model.save_pretrained(tmp, **({} if state_dict is None else {"state_dict": state_dict}))
        save_sid_record(model, tmp)
        swap_dir_into_place(tmp, directory)
    except Exception as err:
        if is_disk_full(err):
            raise DiskFullError(
                f"no space to write the adapter {directory} ({err}); "
                + ("the previous one was left as it was" if directory.exists() else "nothing was written")
                + ". Free disk space, then run the command again",
                err,
            ) from err
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return directory


def load_adapter_weights(model, directory: str | Path) -> None:
    """Load the weights a saved adapter (or a checkpoint) holds into the live adapter of the same structure."""
    from peft.utils import set_peft_model_state_dict
    from safetensors.torch import load_file

    directory = Path(directory)
    state = load_file(str(directory / ADAPTER_WEIGHTS))
    adapter = getattr(model, "active_adapter", "default")
    result = set_peft_model_state_dict(model, state, adapter_name=adapter)
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise ValueError(f"{directory} does not fit this adapter (unexpected keys {unexpected[:3]}).")
