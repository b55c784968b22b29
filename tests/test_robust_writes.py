"""Writes under faults: a SIGKILL at each step of a SID index save leaves an index that loads (the old or the
new one), Ctrl-C or a full disk in the middle of a write keeps the previous file, and a folder the user
cannot write is named in a clear error. Faults happen in forked children (tests/helpers/forked.py)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
from helpers.forked import run
from helpers.robust_faults import NOBODY, as_another_user
from helpers.toy_catalogue import toy_catalogue, toy_vectors

from peft_grounded._io import atomic_write, atomic_write_text, lock_path
from peft_grounded.cli import main
from peft_grounded.sids import SIDIndex, build_sids

pytestmark = pytest.mark.multiproc


def toy_build(seed: int = 0) -> SIDIndex:
    catalogue = toy_catalogue()
    return build_sids(
        catalogue,
        vectors=toy_vectors(catalogue, seed=seed),
        levels=2,
        codes=4,
        seed=seed,
        encoder_fingerprint={"kind": "toy", "model": "clusters"},
        show_progress=False,
    )


def reported(fn, *args) -> int:
    """``fn(*args)`` in a child that reports an ``OSError`` like the CLI (``error: ...``, exit 2)."""
    try:
        fn(*args)
    except OSError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


# --- SIGKILL at each step of an index save ----------------------------------------------------------


def save_and_die_at(index: SIDIndex, folder: Path, call: int, when: str) -> int:
    """Save ``index``, SIGKILLed just before (or after) the ``call``-th ``os.replace`` of the save."""
    original, count = os.replace, [0]

    def replace(src, dst):
        count[0] += 1
        if count[0] == call and when == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        original(src, dst)
        if count[0] == call and when == "after":
            os.kill(os.getpid(), signal.SIGKILL)

    os.replace = replace
    index.save(folder)
    return 0


@pytest.mark.parametrize(
    ("call", "when", "survivor"),
    [(1, "before", "old"), (1, "after", "old"), (2, "before", "old"), (2, "after", "new")],
    ids=["before-tensors", "after-tensors", "before-json", "after-json"],
)
def test_a_kill_at_any_step_of_an_index_save_leaves_a_loadable_index(tmp_path, call, when, survivor):
    old, new = toy_build(0), toy_build(1)
    assert old.fingerprint() != new.fingerprint()
    old.save(tmp_path / "sids")
    child = run(save_and_die_at, new, tmp_path / "sids", call, when)
    assert child.returncode == -signal.SIGKILL
    loaded = SIDIndex.load(tmp_path / "sids")  # verifies sizes and SHA-256
    assert loaded.fingerprint() == (old if survivor == "old" else new).fingerprint()
    new.save(tmp_path / "sids")  # the next save takes the dead process's lock over and tidies up
    assert sorted(p.name for p in (tmp_path / "sids").iterdir() if p.name.startswith(".")) == []
    assert len(list((tmp_path / "sids").glob("sid_index.*.safetensors"))) == 1
    assert not lock_path(tmp_path / "sids").exists()


def test_an_index_save_keeps_the_users_files_in_its_folder(tmp_path):
    toy_build(0).save(tmp_path / "sids")
    (tmp_path / "sids" / "notes.md").write_text("built from the March dump")
    (tmp_path / "sids" / "extra").mkdir()
    new = toy_build(1)
    new.save(tmp_path / "sids")
    assert (tmp_path / "sids" / "notes.md").read_text() == "built from the March dump"
    assert (tmp_path / "sids" / "extra").is_dir()
    assert SIDIndex.load(tmp_path / "sids").fingerprint() == new.fingerprint()


# --- Ctrl-C and a full disk in the middle of a write ------------------------------------------------


def write_then_interrupt(path: Path) -> int:
    def write(f):
        f.write(b"new start")
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C halfway through
        f.write(b" new end")

    atomic_write(path, write)
    return 0


def test_ctrl_c_in_the_middle_of_a_write_keeps_the_previous_file(tmp_path):
    atomic_write_text(tmp_path / "metrics.json", '{"old": true}')
    child = run(write_then_interrupt, tmp_path / "metrics.json")
    assert child.returncode == 1 and "KeyboardInterrupt" in child.err
    assert (tmp_path / "metrics.json").read_text() == '{"old": true}'
    assert sorted(os.listdir(tmp_path)) == ["metrics.json"]  # no temporary file left


def test_a_full_disk_in_the_middle_of_a_write_names_the_file_and_keeps_the_previous(tmp_path):
    target = tmp_path / "metrics.json"
    atomic_write_text(target, '{"old": true}')
    child = run(reported, atomic_write, target, b"x" * 10_000, fsize=4096)
    assert child.returncode == 2
    assert f"error: no space to write {target}" in child.err and "it was left as it was before" in child.err
    assert target.read_text() == '{"old": true}' and sorted(os.listdir(tmp_path)) == ["metrics.json"]


def test_a_full_disk_during_an_index_save_keeps_the_previous_index(tmp_path):
    old = toy_build(0)
    old.save(tmp_path / "sids")
    child = run(reported, toy_build(1).save, tmp_path / "sids", fsize=512)
    assert child.returncode == 2 and "error: no space to write" in child.err
    assert SIDIndex.load(tmp_path / "sids").fingerprint() == old.fingerprint()


def test_build_sids_cli_on_a_full_disk_says_so(tmp_path):
    catalogue = tmp_path / "items.jsonl"
    catalogue.write_text("".join(f'{{"item_id": "{i}", "title": "Film number {i}"}}\n' for i in range(12)))
    argv = ["build-sids", "--catalogue", str(catalogue), "--codes", "4", "--levels", "2", "--no-cache"]
    child = run(main, [*argv, "--output_dir", str(tmp_path / "sids"), "--no-progress"], fsize=1024)
    assert child.returncode == 2, child.err[-2000:]
    assert "error: no space to write" in child.err and "Traceback" not in child.err
    assert not (tmp_path / "sids" / "sid_index.json").exists()


# --- folders the user cannot write --------------------------------------------------------------------


@as_another_user
def test_a_read_only_output_folder_is_named_in_the_error(public_tmp):
    public_tmp.chmod(0o777)  # the user may write beside it (the lock goes there), not into it
    (public_tmp / "sids").mkdir(mode=0o755)
    # the save writes its tensors with safetensors.numpy, imported when first needed: the user may not reach it
    child = run(reported, toy_build(0).save, public_tmp / "sids", user=NOBODY, preload=("safetensors.numpy",))
    assert child.returncode == 2, child.err
    assert f"cannot write {public_tmp / 'sids'}" in child.err and "is not writable" in child.err
    assert list((public_tmp / "sids").iterdir()) == []


@as_another_user
def test_an_output_folder_nowhere_writable_is_refused_before_any_work(public_tmp):
    (public_tmp / "sids").mkdir(mode=0o755)  # neither the folder nor its parent is the user's
    child = run(reported, toy_build(0).save, public_tmp / "sids", user=NOBODY)
    assert child.returncode == 2, child.err
    assert "cannot create the lock file" in child.err and "choose an output folder you can write" in child.err
    assert list((public_tmp / "sids").iterdir()) == []
