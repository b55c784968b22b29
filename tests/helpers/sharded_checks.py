"""Launching tests/helpers/sharded_run.py under accelerate (FSDP2, DeepSpeed, DDP over two simulated nodes), the
single-process references, and the checks every sharded test makes.

Tolerances (trained rows and LoRA, sharded vs one process with the same global batch, 4 steps):

* tiny models: elementwise ``rtol=1e-4, atol=1e-5`` (as tests/test_distributed.py for DDP; measured: at most
  3.4e-6 absolute, 3e-5 of the largest value);
* SmolLM2-135M: per tensor, every element within ``1e-2`` of the tensor's largest update
  ``max |single - initial|``, except at most one in 50 (at least eight), and none beyond twice that update:
  over 30 layers the summation order of the reduced gradients (which varies from run to run) can flip the
  sign of a LoRA element whose gradient is near 0, and Adam's first steps are sign-like, so that element
  moves the other way by a whole step (measured over runs: 1-2 elements of 1,152-3,072 in a ``lora_A``
  with native kernels, 6 of 1,152 with AVX2 kernels only, up to 3.3e-2 of the tensor's update norm; the 99th
  percentile of the others within 3e-5 of the largest update; a wrong reduction moves most elements);
* a killed run resumed vs the uninterrupted run: ``rtol=1e-5, atol=1e-6`` (measured: identical);
* logits of the saved adapter loaded in one process vs the sharded model's: ``rtol=1e-5, atol=1e-5``; for
  SmolLM2 ``atol=2e-4``: its logits reach ~20 after 30 fp32 blocks, and this process and the ranks run the
  matmuls with different thread counts, so in other blockings (measured: 6e-5 at most, 357 of 737,430
  logits above 1e-5).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

from helpers import sharded_run

HERE = Path(__file__).resolve().parent
CONFIGS = HERE.parents[1] / "examples" / "accelerate"
RUNNER = HERE / "sharded_run.py"
TIMEOUT = 600
_references: dict[tuple, Path] = {}


def free_port() -> int:
    """A port nobody listens on now (other test sessions may launch at the same time)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launcher() -> str:
    accelerate = shutil.which("accelerate", path=os.path.dirname(sys.executable))
    assert accelerate, "accelerate's launcher is part of the install"
    return accelerate


def launch_args(config: str, out: Path, jobs: list[str], *runner_args: str, **options) -> list[str]:
    """``accelerate launch --config_file examples/accelerate/<config> [--option value ...] sharded_run.py ...``:
    the shipped file, with only what a 2-CPU machine needs overridden (process count, port, precision)."""
    flags = [f"--{k}={v}" for k, v in {"num_processes": 2, "mixed_precision": "no", **options}.items()]
    runner = [str(RUNNER), str(out), *jobs, "--batch", "2", *runner_args]
    return [launcher(), "launch", "--config_file", str(CONFIGS / config), *flags, *runner]


def run(args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT, env=env)


def launch(
    config: str, out: Path, jobs: list[str], *runner_args: str, **options
) -> subprocess.CompletedProcess:
    return run(launch_args(config, out, jobs, *runner_args, main_process_port=free_port(), **options))


def _read(log) -> str:
    log.seek(0)
    return log.read()


def launch_two_nodes(
    config: str, out: Path, jobs: list[str], *runner_args: str
) -> list[subprocess.CompletedProcess]:
    """One ``accelerate launch`` per simulated node (``--num_machines 2``, one process each) on loopback."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with contextlib.ExitStack() as files:
        nodes = []
        for rank in (0, 1):
            args = launch_args(
                config, out, jobs, *runner_args,
                num_machines=2, machine_rank=rank, main_process_ip="127.0.0.1", main_process_port=port,
            )  # fmt: skip
            # files, not pipes: a full pipe would block one node while the other waits for it
            logs = [files.enter_context(tempfile.TemporaryFile("w+")) for _ in range(2)]
            nodes.append((subprocess.Popen(args, stdout=logs[0], stderr=logs[1], text=True, env=env), logs))
        results = []
        for node, logs in nodes:
            node.wait(timeout=TIMEOUT)
            stdout, stderr = (_read(log) for log in logs)
            results.append(subprocess.CompletedProcess(node.args, node.returncode, stdout, stderr))
    return results


def reference(job: str, tmp_path_factory, **kwargs) -> Path:
    """The job run in this process with the global batch (4), computed once per session."""
    key = (job, tuple(sorted(kwargs.items())))
    if key not in _references:
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state()
        _references[key] = sharded_run.run_job(tmp_path_factory.mktemp("single"), job, **kwargs)
    return _references[key]


def tensors(directory: Path, name: str) -> dict[str, torch.Tensor]:
    return torch.load(directory / name)


def ranks(directory: Path) -> list[dict]:
    return [json.loads((directory / f"rank{r}.json").read_text()) for r in (0, 1)]


def assert_matches_single(run_dir: Path, single: Path, *, per_tensor_update: float | None = None) -> None:
    """Both ranks end with the same full tensors, those of the single-process run (see the tolerances)."""
    expected = tensors(single, "trained_rank0.pt")
    initial = tensors(single, "initial.pt")
    assert tensors(run_dir, "initial.pt").keys() == expected.keys()
    for r in (0, 1):
        got = tensors(run_dir, f"trained_rank{r}.pt")
        assert got.keys() == expected.keys()
        for key, value in expected.items():
            assert (value - initial[key]).abs().max() > 1e-3, f"{key} did not train: the check would be void"
            if per_tensor_update is None:
                torch.testing.assert_close(got[key], value, rtol=1e-4, atol=1e-5, msg=f"rank {r}: {key}")
            else:
                difference, update = (got[key] - value).abs(), (value - initial[key]).abs().max()
                off = int((difference > per_tensor_update * update).sum())
                allowed = max(8, difference.numel() // 50)
                assert off <= allowed, (
                    f"rank {r}: {key}: {off} elements off by more than {per_tensor_update} of its largest"
                    f" update (at most {allowed} may be: Adam's sign-like first steps)"
                )
                assert difference.max() <= 2 * update, f"rank {r}: {key} moved beyond a flipped update"


def assert_saved_adapter_is_the_gathered_rows_and_lora(
    run_dir: Path, single: Path, job: str, *, logits_atol: float = 1e-5
) -> None:
    """The final adapter holds the rows and the LoRA only, at full size, equal to what rank 0 trained, and
    loaded in this process onto a fresh base it gives the sharded model's logits (to ``logits_atol``)."""
    saved = load_file(run_dir / "adapter" / "adapter_model.safetensors")
    expected = load_file(single / "adapter" / "adapter_model.safetensors")
    assert saved.keys() == expected.keys()
    assert all(".grounded_" in k or ".lora_" in k for k in saved), sorted(saved)
    assert {k: v.shape for k, v in saved.items()} == {k: v.shape for k, v in expected.items()}
    trained = tensors(run_dir, "trained_rank0.pt")
    assert sum(v.numel() for v in saved.values()) == sum(v.numel() for v in trained.values())
    model, tokenizer = sharded_run.load_trained(job, run_dir / "adapter")
    torch.testing.assert_close(
        sharded_run.probe_logits(model, tokenizer),
        tensors(run_dir, "probe_logits.pt"),
        rtol=1e-5,
        atol=logits_atol,
    )


def assert_sharded_memory(run_dir: Path, single: Path) -> None:
    """Each rank holds about half of the trainable tensors, of their optimiser state and of the frozen weights."""
    alone = json.loads((single / "rank0.json").read_text())
    for field in ("trainable_bytes", "optimizer_state_bytes", "frozen_bytes"):
        held = [
            r[field] + (r["master_bytes"] if field == "optimizer_state_bytes" else 0) for r in ranks(run_dir)
        ]
        assert alone[field] > 0 and all(0 < h < 0.6 * alone[field] for h in held), (field, held, alone[field])


def checkpoint_bytes(*parts: Path) -> int:
    return sum(p.stat().st_size for part in parts for p in part.rglob("*") if p.is_file())


def assert_killed(result: subprocess.CompletedProcess, directory: Path) -> None:
    assert result.returncode != 0, "rank 0 was to be killed"
    assert "Signal 9 (SIGKILL)" in result.stderr, result.stderr[-3000:]  # torchrun reports the kill
    assert (directory / "checkpoint-2").is_dir() and not (directory / "checkpoint-4").exists()
    assert not (directory / "adapter").exists()


def assert_resumed_like_uninterrupted(resumed: Path, uninterrupted: Path) -> None:
    got, expected = tensors(resumed, "trained_rank0.pt"), tensors(uninterrupted, "trained_rank0.pt")
    assert got.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-5, atol=1e-6, msg=key)


def check_sharded_training(
    config: str, out: Path, tmp_path_factory, jobs: list[str], *, kind: str, weights: list[str]
) -> None:
    """Every check of a sharded launcher (``kind``: "fsdp" or "deepspeed") on ``jobs``, in two launches.

    The first runs ``jobs`` and then ``jobs[-1]`` again, killed after its checkpoint at step 2; the second
    resumes that one. ``weights``: the parts of a checkpoint that hold the weights and optimiser state."""
    killed = f"{jobs[-1]}:killed"
    first = launch(config, out, [*jobs, killed], "--kill-at", "2")
    assert_killed(first, sharded_run.job_dir(out, killed))
    resumed = launch(config, out, [killed], "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for job in jobs:
        run_dir, single = sharded_run.job_dir(out, job), reference(job, tmp_path_factory)
        assert all(r[kind] and r["world_size"] == 2 for r in ranks(run_dir)), job
        assert_matches_single(run_dir, single)
        assert_saved_adapter_is_the_gathered_rows_and_lora(run_dir, single, job)
        assert_sharded_memory(run_dir, single)
        # checkpoints hold the adapter's shards and their optimiser state, never the frozen weights
        frozen = sum(r["frozen_bytes"] for r in ranks(run_dir))
        assert checkpoint_bytes(*(run_dir / "checkpoint-2" / w for w in weights)) < frozen / 20
    assert_resumed_like_uninterrupted(sharded_run.job_dir(out, killed), sharded_run.job_dir(out, jobs[-1]))
