"""The strategy runner under `accelerate launch` with 2 CPU processes (DDP, gloo): the sequence objective with
a time budget, validation NLL and Recall every step on every rank (no hang), the same results on both
ranks, and the run's files written once."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
CONFIG = HERE.parent / "examples" / "accelerate" / "ddp_cpu_2proc.yaml"


@pytest.mark.slow
@pytest.mark.multiproc
def test_runner_under_two_processes(tmp_path, tiny_model_factory, tokenizer):
    accelerate = shutil.which("accelerate", path=os.path.dirname(sys.executable))
    assert accelerate, "accelerate's launcher is part of the install"
    model_dir = tmp_path / "base"
    tiny_model_factory("llama", True).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    launched = subprocess.run(
        [
            accelerate,
            "launch",
            "--config_file",
            str(CONFIG),
            "--main_process_port",
            "29523",
            str(HERE / "helpers" / "strategy_run.py"),
            str(model_dir),
            str(tmp_path / "run"),
            str(tmp_path / "results"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert launched.returncode == 0, launched.stderr[-3000:]
    rank0 = json.loads((tmp_path / "results" / "rank0.json").read_text())
    rank1 = json.loads((tmp_path / "results" / "rank1.json").read_text())
    assert rank0 == rank1
    assert [p["step"] for p in rank0["valid_curve"]] == [1, 2, 3]
    assert [p["step"] for p in rank0["validation_curve"]] == [1, 2, 3]
    run = tmp_path / "run"
    assert json.loads((run / "metrics.json").read_text())["metrics"] == rank0["metrics"]
    assert (run / "curve.json").is_file() and (
        run / "sft" / "adapter" / "adapter_model.safetensors"
    ).is_file()
    leftovers = [p.name for p in run.rglob(".*") if p.name.endswith(".tmp") or ".old" in p.name]
    assert not leftovers
