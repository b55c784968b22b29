"""The steps-to-reach script: first step at or below the reference's final progressive loss, per seed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def script():
    from benchmarks import steps_to_reach

    return steps_to_reach


def _run(tmp_path: Path, name: str, losses: list[float]) -> Path:
    run = tmp_path / name
    run.mkdir()
    log = [{"step": 10 * (i + 1), "item_nll": v, "seconds": 5.0 * (i + 1)} for i, v in enumerate(losses)]
    log.append({"step": 10 * len(losses), "train_loss": 1.0})  # the trainer's summary has no item_nll
    (run / "log_history.json").write_text(json.dumps(log))
    return run


def test_steps_to_reach_per_seed(script, tmp_path, capsys):
    mean = _run(tmp_path, "mean", [20.0, 15.0, 12.0, 11.0])  # final 11.0 at step 40
    fast = _run(tmp_path, "fast", [18.0, 10.9, 9.0, 8.0])  # reaches 11.0 at step 20
    never = _run(tmp_path, "never", [30.0, 25.0, 20.0, 19.0])
    assert script.steps_to_reach(script.curve(fast), 11.0) == 20
    assert script.steps_to_reach(script.curve(never), 11.0) is None
    script.main(["--reference", f"mean={mean}", "--run", f"fast={fast}", "--run", f"never={never}"])
    out = capsys.readouterr().out
    assert "| fast | 0 | 40 | 20 | 20 | 50% |" in out
    assert "| never | 0 | 40 | 20 | - | not reached |" in out
    with pytest.raises(SystemExit, match=r"log_history\.json"):
        script.curve(tmp_path / "missing")
