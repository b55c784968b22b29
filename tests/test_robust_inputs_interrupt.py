"""Ctrl-C (SIGINT) in the middle of ``build-sids``: a clean "interrupted" line, exit code 130, no traceback,
and nothing half-written (no index, no temporary file, no incomplete embedding-cache shard)."""

# ruff: noqa: F811 (the world fixture is imported, then named by the tests)
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from helpers.robust_world import snapshot, world  # noqa: F401


@pytest.mark.multiproc
def test_sigint_during_build_sids_exits_130_and_leaves_nothing_half_written(world, tmp_path):
    out, cache = tmp_path / "sids", tmp_path / "cache"
    before = snapshot(world["root"])
    command = [
        sys.executable,
        "-m",
        "peft_grounded.cli",
        "build-sids",
        "--catalogue",
        str(world["catalogue"]),
        "--encoder",
        f"lm:{world['base']}",
        "--quantizer",
        "rqvae",
        "--rqvae-epochs",
        "1000000",  # hours: the signal always lands mid-build
        "--codes",
        "4",
        "--levels",
        "2",
        "--no-progress",
        "--cache-dir",
        str(cache),
        "--output_dir",
        str(out),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PEFT_GROUNDED_DEBUG": ""}
    # SIGINT as a terminal delivers it: a shell that started this suite in the background (`cmd &`) left it
    # ignored, which the child would inherit and Python would then never turn into KeyboardInterrupt
    default_sigint = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731
    proc = subprocess.Popen(
        command, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, preexec_fn=default_sigint
    )
    lines = []
    try:
        for line in proc.stderr:  # the build logs the catalogue once it has loaded it
            lines.append(line)
            if "catalogue toy" in line:
                break
        time.sleep(3.0)  # encoding, then the RQ-VAE's epochs
        assert proc.poll() is None, "".join(lines)
        proc.send_signal(signal.SIGINT)
        rest, stdout = proc.stderr.read(), proc.stdout.read()
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = "".join(lines) + rest
    assert code == 130, (code, err[-2000:])
    assert "interrupted: build-sids stopped before it finished" in err and "Traceback" not in err
    assert "saved to" not in stdout
    assert not (out / "sid_index.json").exists()
    leftovers = [p for p in tmp_path.rglob("*") if p.name.startswith(".") or p.name.endswith(".tmp")]
    assert leftovers == []
    for keys in cache.rglob("*.keys.npy"):  # a shard with keys is complete: its vectors and checksum exist
        assert keys.with_name(keys.name.replace(".keys.npy", ".vecs.npy")).is_file()
        assert keys.with_name(keys.name.replace(".keys.npy", ".sum.json")).is_file()
    assert snapshot(world["root"]) == before
