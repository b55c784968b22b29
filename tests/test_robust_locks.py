"""One writer per output folder (peft_grounded._io): a second process is refused at once with the folder and
the holder's pid, a killed holder's lock is taken over with a message, and the lock itself leaves nothing
behind. Holders and contenders are real processes (forked, tests/helpers/forked.py)."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from pathlib import Path

import pytest
from helpers.forked import run, start, wait_for
from helpers.robust_faults import NOBODY, as_another_user
from helpers.toy_catalogue import toy_catalogue, toy_index, toy_vectors

from peft_grounded._io import OutputBusyError, lock_path, output_lock
from peft_grounded.cli import main
from peft_grounded.sids import SIDIndex, build_sids

pytestmark = pytest.mark.multiproc


def hold(folder, release: Path, command: str = "build-sids") -> int:
    """A child that holds ``folder``'s lock until ``release`` exists."""
    with output_lock(folder, command):
        (release.parent / "held").write_text(str(os.getpid()))
        wait_for(release.exists, timeout=120)
    return 0


@pytest.fixture
def holder(tmp_path):
    """Another process holding ``tmp_path/out``'s lock (released at the end of the test)."""
    release = tmp_path / "release"
    child = start(hold, tmp_path / "out", release)
    wait_for((tmp_path / "held").exists, child=child)
    yield child
    release.touch()
    child.wait(60)


def test_a_second_writer_is_refused_with_the_folder_and_the_holders_pid(tmp_path, holder):
    with pytest.raises(OutputBusyError) as caught, output_lock(tmp_path / "out", "evaluate"):
        pass
    message = str(caught.value)
    assert str((tmp_path / "out").resolve()) in message
    assert f"pid {holder.pid}" in message and "`build-sids`" in message
    assert "Wait for it to finish, or choose another output folder" in message
    assert caught.value.errno == 16  # EBUSY: the CLI reports it like any OSError, without a traceback


def test_after_the_holder_finishes_the_folder_is_free_and_no_lock_file_is_left(tmp_path):
    release = tmp_path / "release"
    release.touch()
    assert run(hold, tmp_path / "out", release).returncode == 0
    assert not lock_path(tmp_path / "out").exists()
    with output_lock(tmp_path / "out", "evaluate") as path:
        assert path.exists() and json.loads(path.read_text())["pid"] == os.getpid()
    assert not path.exists()


def test_the_lock_creates_no_folder_and_lives_beside_it(tmp_path):
    with output_lock(tmp_path / "new" / "out", "ground") as path:
        assert path == tmp_path / "new" / ".out.peft_grounded.lock"
        assert not (tmp_path / "new" / "out").exists()  # a refused command leaves no folder behind
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == []


def test_a_lock_left_by_a_killed_process_is_taken_over_with_a_message(tmp_path, caplog):
    child = start(hold, tmp_path / "out", tmp_path / "never")
    wait_for((tmp_path / "held").exists, child=child)
    child.kill()
    assert child.wait(30) == -signal.SIGKILL
    assert json.loads(lock_path(tmp_path / "out").read_text())["pid"] == child.pid  # the stale file
    with (
        caplog.at_level(logging.WARNING, logger="peft_grounded"),
        output_lock(tmp_path / "out", "build-sids"),
    ):
        pass
    assert f"took over the lock left by pid {child.pid}" in caplog.text and "no longer running" in caplog.text
    assert not lock_path(tmp_path / "out").exists()


def test_a_garbled_lock_file_without_holder_is_taken_over(tmp_path):
    lock_path(tmp_path / "out").write_bytes(b"\x00\xffnot json")
    with output_lock(tmp_path / "out", "demo") as path:
        assert json.loads(path.read_text())["command"] == "demo"
    assert not path.exists()


def contend(folder) -> int:
    """A child trying the lock once: 0 if it got it, 3 if refused (message on stderr)."""
    try:
        with output_lock(folder, "contender"):
            return 0
    except OutputBusyError as err:
        print(err, file=sys.stderr)
        return 3


def test_the_lock_is_reentrant_in_one_process_and_held_until_the_outer_block_ends(tmp_path):
    out = tmp_path / "out"
    with output_lock(out, "demo"):
        with output_lock(out, "build-sids"):  # a stage of the same process
            assert run(contend, out).returncode == 3
        assert run(contend, out).returncode == 3  # the inner block did not release it
    assert run(contend, out).returncode == 0


def test_a_symlink_to_the_folder_shares_its_lock(tmp_path, holder):
    (tmp_path / "out").mkdir(exist_ok=True)
    (tmp_path / "alias").symlink_to(tmp_path / "out")
    child = run(contend, tmp_path / "alias")
    assert child.returncode == 3 and f"pid {holder.pid}" in child.err


def test_non_main_ranks_of_a_distributed_launch_do_not_lock(tmp_path, holder, monkeypatch):
    monkeypatch.setenv("RANK", "1")  # ranks > 0 write under rank 0's lock
    with output_lock(tmp_path / "out", "ground training"):
        pass
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(OutputBusyError), output_lock(tmp_path / "out", "ground training"):
        pass


def as_nobody_lock(folder) -> int:
    with output_lock(folder, "evaluate") as path:
        print(path)
        return 0


@as_another_user
def test_an_output_folder_in_an_unwritable_parent_is_locked_inside(public_tmp):
    (public_tmp / "mine").mkdir()
    os.chown(public_tmp / "mine", NOBODY, NOBODY)  # the user's own folder in a folder they cannot write
    child = run(as_nobody_lock, public_tmp / "mine", user=NOBODY)
    assert child.returncode == 0, child.err
    assert child.out.strip() == str(public_tmp / "mine" / ".peft_grounded.lock")
    assert not (public_tmp / "mine" / ".peft_grounded.lock").exists()
    assert sorted(p.name for p in public_tmp.iterdir()) == ["mine"]


def build_into(folder, seed: int) -> int:
    """``build_sids`` like the command: prints the index's fingerprint, or the refusal (exit 2)."""
    catalogue = toy_catalogue()
    try:
        index = build_sids(
            catalogue,
            folder,
            vectors=toy_vectors(catalogue, seed=seed),
            levels=2,
            codes=4,
            seed=seed,
            encoder_fingerprint={"kind": "toy", "model": "clusters"},
            show_progress=False,
        )
    except OSError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(index.fingerprint())
    return 0


def test_two_builds_into_one_folder_at_once_leave_exactly_one_index(tmp_path):
    out = tmp_path / "sids"
    first, second = start(build_into, out, 0), start(build_into, out, 1)
    codes = [first.wait(120), second.wait(120)]
    assert sorted(codes) == [0, 2], (first.err, second.err)
    winner, loser = (first, second) if codes[0] == 0 else (second, first)
    assert "being written by another" in loser.err or "holds a SID index already" in loser.err
    assert SIDIndex.load(out).fingerprint() == winner.out.strip()  # the winner's index, whole


def test_build_sids_cli_refuses_a_busy_folder_before_any_work(tmp_path, holder, capsys):
    catalogue = tmp_path / "cat.jsonl"
    catalogue.write_text('{"item_id": "a", "title": "A"}\n')
    code = main(
        ["build-sids", "--catalogue", str(catalogue), "--output_dir", str(tmp_path / "out"), "--no-cache"]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and f"pid {holder.pid}" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_add_items_cli_refuses_a_busy_folder(tmp_path, holder, capsys):
    toy_index(toy_catalogue()).save(tmp_path / "parent")
    new = tmp_path / "new.jsonl"
    new.write_text('{"item_id": "n1", "title": "New"}\n')
    argv = ["add-items", "--sid-index", str(tmp_path / "parent"), "--catalogue", str(new)]
    code = main([*argv, "--output_dir", str(tmp_path / "out"), "--encoder", "minilm", "--no-cache"])
    assert code == 2
    assert f"pid {holder.pid}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_index_save_refuses_a_folder_another_process_writes(tmp_path, holder):
    index = toy_index(toy_catalogue())
    with pytest.raises(OutputBusyError, match=f"pid {holder.pid}"):
        index.save(tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_demo_into_a_folder_another_process_writes_stops_before_any_work(tmp_path, holder):
    from peft_grounded.pipeline import run_demo

    with pytest.raises(OutputBusyError, match=f"pid {holder.pid}"):
        run_demo(
            "smoke", tmp_path / "out", model="/nonexistent", catalogue=toy_catalogue(), diagnostics=False
        )
    assert not (tmp_path / "out").exists()
