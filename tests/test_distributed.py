"""Grounding under `accelerate launch` with 2 CPU processes (DDP, gloo) equals one process, same global batch."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).parent
CONFIG = HERE.parent / "examples" / "accelerate" / "ddp_cpu_2proc.yaml"


@pytest.mark.slow
@pytest.mark.multiproc
def test_two_processes_match_one_with_the_same_global_batch(tmp_path):
    accelerate = shutil.which("accelerate", path=os.path.dirname(sys.executable))
    assert accelerate, "accelerate's launcher is part of the install"
    single = subprocess.run(
        [
            sys.executable,
            str(HERE / "helpers" / "grounding_run.py"),
            tmp_path / "one",
            "--max-steps",
            "4",
            "--batch",
            "4",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert single.returncode == 0, single.stderr[-3000:]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    launched = subprocess.run(
        [
            accelerate,
            "launch",
            "--config_file",
            str(CONFIG),
            "--main_process_port",
            "29517",
            str(HERE / "helpers" / "grounding_run.py"),
            str(tmp_path / "two"),
            "--max-steps",
            "4",
            "--batch",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert launched.returncode == 0, launched.stderr[-3000:]
    rank0 = torch.load(tmp_path / "two" / "rows_rank0.pt")
    rank1 = torch.load(tmp_path / "two" / "rows_rank1.pt")
    reference = torch.load(tmp_path / "one" / "final_rows.pt")
    for key in reference:
        assert torch.equal(rank0[key], rank1[key]), "DDP ranks diverged"
        torch.testing.assert_close(rank0[key], reference[key], rtol=1e-4, atol=1e-5)
