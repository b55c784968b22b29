"""How a training run's checkpoints are written and resumed without loss.

* every checkpoint is written into ``.checkpoint-N.partial`` and renamed into place when complete, so a kill or
  a full disk at any instant leaves the last complete checkpoint; a resume skips (and moves aside) an
  incomplete checkpoint (written otherwise, or damaged since), saying so;
* resuming a finished run is a no-op that says so (the adapter and the log are left as they are);
* TRL's draft model card does not replace a ``README.md`` of the user's in the output folder.

:class:`SafeCheckpoints` is the part of :class:`~.trainer.RunTrainer` that does it (a mixin over
``transformers.Trainer``'s checkpoint hooks).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from transformers.trainer_callback import TrainerState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, TrainOutput, rotate_checkpoints

from .._io import DiskFullError, is_disk_full, swap_dir_into_place
from .._owned import TRL_CARD_MARKER, is_generated_card
from ..adapter.layer import wrapped_keys
from ..adapter.saved import ADAPTER_WEIGHTS
from . import runs
from .adapter_files import load_adapter_weights
from .runs import ADAPTER_DIR, LOG_FILE

logger = logging.getLogger(__name__)

PARTIAL = ".partial"  # suffix of a checkpoint being written (``.checkpoint-N.partial``)
INCOMPLETE = ".incomplete"  # suffix of an incomplete checkpoint moved aside on resume
LEFTOVER_PATTERNS = (  # what a killed run of this trainer can leave behind, all of it its own
    f".{PREFIX_CHECKPOINT_DIR}-*{PARTIAL}",
    f".{ADAPTER_DIR}.*",
    f".{runs.MANIFEST}.*.tmp",
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
        raise runs.RunMismatchError(
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
        runs.check_manifest(output_dir / runs.MANIFEST, self.manifest)
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
        last, incomplete = runs.last_complete_checkpoint(output_dir)
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
                last, _ = runs.last_complete_checkpoint(root)
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
        runs.write_json_atomic(written / runs.MANIFEST, self.manifest)
        best = self.state.best_model_checkpoint
        if best is not None and Path(best).parent == written.parent:  # set while the .partial folder was used
            self.state.best_model_checkpoint = str(final.parent / Path(best).name)
            state_file = written / runs.TRAINER_STATE
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
    path = Path(checkpoint) / runs.TRAINER_STATE
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
