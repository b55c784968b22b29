"""Checkpoints and resumes under faults: a SIGKILL or a full disk while a checkpoint is written leaves the
last complete one, ``--resume_from_checkpoint`` ends where an uninterrupted run ends, a finished run's resume
changes nothing, and the trainer replaces no file of the user's.

Faults happen in forked children (tests/helpers/forked.py): SIGKILL at chosen instants of a checkpoint write, and
a full disk as a file-size limit (``RLIMIT_FSIZE``: a write beyond it fails with ``EFBIG``)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys

import pytest
import torch
from helpers.forked import limit_file_size, run
from helpers.robust_faults import assert_same_rows, grounding_trainer, logged_steps, rows, snapshot, train
from transformers import TrainerCallback

from peft_grounded._io import lock_path
from peft_grounded.training import runs
from peft_grounded.training.runs import RunMismatchError, checkpoint_problem

pytestmark = pytest.mark.multiproc


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """An uninterrupted run of 6 steps (checkpoints every 2): what every interrupted run must end as."""
    out = tmp_path_factory.mktemp("straight") / "run"
    train(out)
    return {"out": out, "rows": rows(out), "steps": logged_steps(out)}


def copy_run(straight, tmp_path, finished: bool):
    """The straight run's folder, as it is (``finished``) or as a kill before its adapter left it."""
    out = tmp_path / "run"
    shutil.copytree(straight["out"], out)
    if not finished:
        shutil.rmtree(out / "adapter")
        (out / "log_history.json").unlink()
    return out


def crash(output_dir, fault) -> int:
    """The child's body: the tiny run with ``fault(trainer)`` installed; a refusal prints like the CLI."""
    trainer = grounding_trainer(output_dir)
    fault(trainer)
    try:
        trainer.train()
    except OSError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def at_partial_checkpoint(path, step: int = 4) -> bool:
    return f".checkpoint-{step}.partial" in str(path)


# --- SIGKILL while a checkpoint is written -------------------------------------------------------------


def kill_in_weights(trainer):
    import peft.peft_model

    original = peft.peft_model.safe_save_file

    def half_then_die(tensors, path, *args, **kwargs):
        if at_partial_checkpoint(path):
            with open(path, "wb") as f:
                f.write(b"\0" * 100)  # half a file on disk, then the process is gone
            os.kill(os.getpid(), signal.SIGKILL)
        return original(tensors, path, *args, **kwargs)

    peft.peft_model.safe_save_file = half_then_die


def kill_in_optimizer(trainer):
    original = torch.save

    def half_then_die(obj, path, *args, **kwargs):
        if isinstance(path, str) and path.endswith("optimizer.pt") and at_partial_checkpoint(path):
            with open(path, "wb") as f:
                f.write(b"PK\3\4")
            os.kill(os.getpid(), signal.SIGKILL)
        return original(obj, path, *args, **kwargs)

    torch.save = half_then_die


def kill_before_rename(trainer):
    from pathlib import Path

    original = Path.rename

    def die(self, target):
        if self.name == "checkpoint-4" and at_partial_checkpoint(self):
            os.kill(os.getpid(), signal.SIGKILL)
        return original(self, target)

    Path.rename = die


@pytest.mark.parametrize(
    "fault", [kill_in_weights, kill_in_optimizer, kill_before_rename], ids=lambda f: f.__name__
)
def test_sigkill_while_a_checkpoint_is_written_leaves_the_previous_one(straight, tmp_path, fault, caplog):
    out = tmp_path / "run"
    child = run(crash, out, fault)
    assert child.returncode == -signal.SIGKILL, child.err[-3000:]
    assert not (out / "checkpoint-4").exists()  # never visible half-written
    assert (out / ".checkpoint-4.partial").is_dir()
    assert checkpoint_problem(out / "checkpoint-2") is None
    with caplog.at_level(logging.WARNING, logger="peft_grounded"):
        train(out, resume=True)
    assert "removed what a killed run left: .checkpoint-4.partial" in caplog.text
    assert not (out / ".checkpoint-4.partial").exists()
    assert_same_rows(rows(out), straight["rows"])
    assert logged_steps(out) == straight["steps"]
    assert not lock_path(out).exists()  # the killed run's lock was taken over and released


# --- a full disk while a checkpoint is written ---------------------------------------------------------


def full_before_weights(trainer):
    """The disk fills right before checkpoint-4 (its first file, the adapter weights, is 5 KB)."""

    class Fill(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 3:
                limit_file_size(4000)

    trainer.add_callback(Fill())


def full_before_tokenizer(trainer):
    """Weights and card fit; the tokenizer's 3.5 MB tokenizer.json does not."""

    class Fill(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 3:
                limit_file_size(200_000)

    trainer.add_callback(Fill())


def full_before_optimizer(trainer):
    """The disk fills when the optimiser state (torch.save) is written."""
    original = trainer._save_optimizer_and_scheduler

    def fill_then_save(output_dir):
        if at_partial_checkpoint(output_dir):
            limit_file_size(4000)
        return original(output_dir)

    trainer._save_optimizer_and_scheduler = fill_then_save


def full_before_trainer_state(trainer):
    """The disk fills for the last file of a checkpoint, trainer_state.json (plain Python I/O)."""
    from transformers.trainer_callback import TrainerState

    original = TrainerState.save_to_json

    def fill_then_save(self, path):
        if at_partial_checkpoint(path):
            limit_file_size(1000)
        return original(self, path)

    TrainerState.save_to_json = fill_then_save


@pytest.mark.parametrize(
    "fault",
    [full_before_weights, full_before_tokenizer, full_before_optimizer, full_before_trainer_state],
    ids=lambda f: f.__name__,
)
def test_full_disk_during_a_checkpoint_says_so_and_resume_works(straight, tmp_path, fault):
    out = tmp_path / "run"
    child = run(crash, out, fault)
    assert child.returncode == 2, child.err[-3000:]
    message = child.err.strip().splitlines()[-1]
    assert message.startswith("error: no space to write checkpoint"), child.err[-3000:]
    assert "checkpoint-4" in message and "checkpoint-2, is kept" in message and "resume" in message
    assert "Traceback" not in child.err
    assert not (out / ".checkpoint-4.partial").exists() and not (out / "checkpoint-4").exists()
    assert checkpoint_problem(out / "checkpoint-2") is None
    train(out, resume=True)
    assert_same_rows(rows(out), straight["rows"])
    assert logged_steps(out) == straight["steps"]


def test_full_disk_while_the_final_adapter_is_written(straight, tmp_path):
    """Training ends; the loss log and the adapter no longer fit: a resume writes them, with no new step."""

    def fill_at_end(trainer):
        class Fill(TrainerCallback):
            def on_train_end(self, args, state, control, **kwargs):
                limit_file_size(1000)

        trainer.add_callback(Fill())

    out = tmp_path / "run"
    child = run(crash, out, fill_at_end)
    assert child.returncode == 2, child.err[-3000:]
    assert "finished training, but the disk filled" in child.err and "without training again" in child.err
    assert not (out / "adapter").exists() and checkpoint_problem(out / "checkpoint-6") is None
    trainer = train(out, resume=True)
    assert trainer.state.global_step == 6 and not (out / "checkpoint-7").exists()
    assert_same_rows(rows(out), straight["rows"])


# --- resuming ------------------------------------------------------------------------------------------


def test_killed_after_its_last_checkpoint_the_run_finishes_without_an_extra_step(straight, tmp_path, caplog):
    out = copy_run(straight, tmp_path, finished=False)
    with caplog.at_level(logging.WARNING, logger="peft_grounded"):
        trainer = train(out, resume=True)
    assert "ended training at step 6" in caplog.text
    assert trainer.state.global_step == 6 and not (out / "checkpoint-7").exists()
    assert_same_rows(rows(out), straight["rows"])
    assert logged_steps(out) == straight["steps"]


def test_resume_on_a_finished_run_is_a_no_op_that_says_so(straight, tmp_path, caplog):
    out = copy_run(straight, tmp_path, finished=True)
    before = snapshot(out)
    with caplog.at_level(logging.WARNING, logger="peft_grounded"):
        trainer = train(out, resume=True)
    assert "holds this run finished (step 6): nothing to resume" in caplog.text
    assert snapshot(out) == before  # adapter, log, checkpoints, manifest: the same bytes
    assert trainer.state.global_step == 6
    layer = trainer.model.get_input_embeddings()  # the model holds the finished adapter's rows
    assert torch.equal(
        layer.grounded_embedding["default"].detach(),
        straight["rows"][next(k for k in straight["rows"] if "grounded_embedding" in k)],
    )


def test_resume_on_a_finished_run_with_other_settings_is_refused(straight, tmp_path):
    out = copy_run(straight, tmp_path, finished=True)
    before = snapshot(out)
    with pytest.raises(RunMismatchError, match="seed: 0 -> 1"):
        train(out, resume=True, seed=1)
    assert snapshot(out) == before


def damage_state(checkpoint):
    (checkpoint / "trainer_state.json").unlink()


def truncate_state(checkpoint):
    path = checkpoint / "trainer_state.json"
    path.write_text(path.read_text()[:40])


def drop_manifest(checkpoint):
    (checkpoint / "run.json").unlink()


def drop_weights(checkpoint):
    (checkpoint / "adapter_model.safetensors").unlink()


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (damage_state, "no trainer_state.json"),
        (truncate_state, "a truncated trainer_state.json"),
        (drop_manifest, "no run.json"),
        (drop_weights, "no weights file"),
    ],
)
def test_an_incomplete_checkpoint_is_skipped_said_and_moved_aside(straight, tmp_path, damage, said, caplog):
    """A checkpoint left incomplete by older code (no staging): transformers would pick it; we do not."""
    out = copy_run(straight, tmp_path, finished=False)
    damage(out / "checkpoint-6")
    with caplog.at_level(logging.WARNING, logger="peft_grounded"):
        train(out, resume=True)
    assert (
        f"checkpoint-6 is incomplete ({said}" in caplog.text and "Resuming from checkpoint-4" in caplog.text
    )
    assert (out / ".checkpoint-6.incomplete").is_dir()  # kept, out of transformers' sight
    assert checkpoint_problem(out / "checkpoint-6") is None  # written again, complete
    assert_same_rows(rows(out), straight["rows"])


def test_sigint_during_training_releases_the_lock_and_the_run_resumes(straight, tmp_path):
    def interrupt(trainer):
        class CtrlC(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                if state.global_step == 3:
                    os.kill(os.getpid(), signal.SIGINT)

        trainer.add_callback(CtrlC())

    out = tmp_path / "run"
    child = run(crash, out, interrupt)
    assert child.returncode == 1 and "KeyboardInterrupt" in child.err
    assert not lock_path(out).exists()  # released on the way out
    assert checkpoint_problem(out / "checkpoint-2") is None
    train(out, resume=True)
    assert_same_rows(rows(out), straight["rows"])


def test_leftovers_of_a_killed_run_are_removed_and_user_files_kept(straight, tmp_path):
    out = copy_run(straight, tmp_path, finished=False)
    (out / ".adapter.k2j3h4").mkdir()
    (out / ".adapter.k2j3h4" / "adapter_model.safetensors").write_bytes(b"half")
    (out / ".run.json.x1y2.tmp").write_text("{")
    (out / ".checkpoint-8.partial").mkdir()
    (out / "notes.txt").write_text("mine")
    train(out, resume=True)
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []
    assert (out / "notes.txt").read_text() == "mine"
    assert_same_rows(rows(out), straight["rows"])


# --- files of the user's in the output folder ----------------------------------------------------------


def test_a_readme_of_the_users_survives_training_in_its_folder(tmp_path, caplog):
    out = tmp_path / "run"
    out.mkdir()
    (out / "README.md").write_text("# My experiment\n\nNotes I keep here.\n")
    with caplog.at_level(logging.WARNING, logger="peft_grounded"):
        train(out, max_steps=4)
    assert (out / "README.md").read_text() == "# My experiment\n\nNotes I keep here.\n"
    assert caplog.text.count("is not a card TRL wrote: kept as it is") == 1  # said once, not per checkpoint
    assert (out / "adapter" / "adapter_model.safetensors").is_file()


def test_trls_card_is_still_written_into_a_folder_of_our_own(tmp_path):
    out = tmp_path / "run"
    train(out, max_steps=2)
    card = (out / "README.md").read_text()
    assert "generated_from_trainer" in card and "trl" in card  # TRL's behaviour where nothing is at stake


@pytest.mark.parametrize(
    ("name", "content"),
    [("run.json", "my run notes, not JSON"), ("run.json", "[1, 2]"), ("log_history.json", '{"loss": 1}')],
)
def test_a_foreign_manifest_or_log_in_a_fresh_folder_is_refused(tmp_path, name, content):
    out = tmp_path / "run"
    out.mkdir()
    (out / name).write_text(content)
    with pytest.raises(RunMismatchError, match=f"{name} is not a .* a peft_grounded trainer wrote"):
        train(out, max_steps=2)
    assert (out / name).read_text() == content
    assert sorted(p.name for p in out.iterdir()) == [name]


def test_checkpoints_record_the_manifest_before_they_appear(straight):
    """Every published checkpoint is complete: manifest, state and weights (what a resume checks)."""
    found = runs.checkpoints(straight["out"])
    assert [p.name for p in found] == ["checkpoint-4", "checkpoint-6"]  # save_total_limit=2 rotated 2 away
    for checkpoint in found:
        assert checkpoint_problem(checkpoint) is None
        assert json.loads((checkpoint / "run.json").read_text()) == json.loads(
            (straight["out"] / "run.json").read_text()
        )
