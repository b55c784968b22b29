"""The prepared GPU run (benchmarks/gpu): the model's transfer in parts, and the whole run as a CPU dry run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from benchmarks.gpu import gpu_run
from benchmarks.gpu.transfer import TransferError, reassemble, sha256_file, split_file, write_manifest

ROOT = Path(__file__).resolve().parent.parent

DEVICE_LIMIT = 64 * 2**20  # bytes one device command may send (benchmarks/gpu/README.md)


def _file(path: Path, size: int) -> Path:
    path.write_bytes(os.urandom(size))
    return path


def test_split_and_reassemble_is_byte_identical(tmp_path):
    source = _file(tmp_path / "model.gguf", 3 * 2**20 + 12345)
    manifest = split_file(source, [tmp_path / "first", tmp_path / "second"], [2**20])
    write_manifest(manifest, tmp_path / "second")
    assert [p["bytes"] for p in manifest["parts"]] == [2**20, 2 * 2**20 + 12345]
    assert json.loads((tmp_path / "second" / "manifest.json").read_text()) == manifest
    # the first part was left elsewhere by an earlier command (/tmp/pg_parts on the device)
    kept = tmp_path / "kept"
    kept.mkdir()
    (tmp_path / "first" / "model.gguf.part0").rename(kept / "model.gguf.part0")
    target = reassemble(
        manifest, [tmp_path / "second", tmp_path / "first", kept], tmp_path / "site" / "m.gguf"
    )
    assert target.read_bytes() == source.read_bytes()
    assert sha256_file(target) == manifest["sha256"]
    # an intact target is kept as it is; a damaged one is rebuilt
    mtime = target.stat().st_mtime_ns
    assert reassemble(manifest, [tmp_path / "second", kept], target).stat().st_mtime_ns == mtime
    target.write_bytes(b"broken")
    assert reassemble(manifest, [tmp_path / "second", kept], target).read_bytes() == source.read_bytes()


def test_reassembly_refuses_missing_or_damaged_parts(tmp_path):
    source = _file(tmp_path / "m.bin", 5000)
    manifest = split_file(source, [tmp_path / "a", tmp_path / "b"], [2000])
    target = tmp_path / "out.bin"
    with pytest.raises(TransferError, match="preparatory command"):
        reassemble(manifest, [tmp_path / "b"], target)  # part 0 never arrived
    part = tmp_path / "a" / "m.bin.part0"
    data = bytearray(part.read_bytes())
    data[10] ^= 0xFF
    part.write_bytes(bytes(data))  # same size, other bytes
    with pytest.raises(TransferError, match="sha256"):
        reassemble(manifest, [tmp_path / "a", tmp_path / "b"], target)
    part.write_bytes(bytes(data[:-1]))
    with pytest.raises(TransferError, match="bytes"):
        reassemble(manifest, [tmp_path / "a", tmp_path / "b"], target)
    assert not target.exists() and not list(tmp_path.glob(".out.bin.tmp*"))
    with pytest.raises(ValueError, match="non-empty last part"):
        split_file(source, [tmp_path / "a", tmp_path / "b"], [5000])


def test_the_real_gguf_split_fits_the_device_limit(tmp_path):
    """The plan of README.md: 56 MiB + the rest, each command under 64 MiB with the tracked tree."""
    from peft_grounded import assets

    gguf = assets.smollm2_gguf()
    size = gguf.stat().st_size
    tree = sum((ROOT / f).stat().st_size for f in _tracked_files())
    first = gpu_run.GGUF_FIRST_PART_BYTES
    assert tree + first < DEVICE_LIMIT
    assert tree + (size - first) + 12 * 2**20 < DEVICE_LIMIT  # + wheels (2.8 MiB), catalogues, SIDs


def _tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [f for f in out.splitlines() if (ROOT / f).is_file()]


def test_the_runs_arguments_are_ones_bench_quality_accepts():
    help_text = gpu_run.bench_quality_help()
    assert "--strategies" in help_text  # really its help
    for plan in (gpu_run.gpu_plan(), gpu_run.dry_plan()):
        command = gpu_run.unit_command(gpu_run.Unit("ml-100k", 0), plan, Path("p"), Path("w"), [])
        assert all(arg in help_text for arg in command if arg.startswith("--"))
    args, label = gpu_run.objective_supported("sequence")
    assert (args == ["--objective", "sequence"]) == ("--objective" in help_text)
    assert gpu_run.objective_supported(None) == ([], "default (the benchmark's own)")
    assert "does not accept" in label or label == "sequence"


def test_dry_and_gpu_plans_differ_only_in_the_budget():
    gpu, dry = gpu_run.gpu_plan(), gpu_run.dry_plan()
    assert gpu.strategies == dry.strategies == ["mean", "centroid", "gti", "centroid_gti"]
    assert gpu.datasets == dry.datasets == ["ml-100k", "amazon-office"]
    assert gpu.device == "cuda" and dry.device == "cpu"
    assert gpu.seeds[:3] == [0, 1, 2] and gpu.eval_users >= 100_000  # 3 seeds first; all test users
    assert gpu.budget_s + 45 < 600  # inside one 10-minute command (wheels, reassembly: ~15 s)


@pytest.mark.slow
def test_dry_run_end_to_end_and_resume(tmp_path):
    """prepare -> run.sh --dry-run (CPU, tiny budget; ML-100K and two strategies, one without and one with
    grounding, to keep it short): the files the GPU run returns; a second call finds everything done and
    only rewrites the summary."""
    env = os.environ | {
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "OMP_NUM_THREADS": "1",
        "PYTHON": sys.executable,
    }
    transfer = tmp_path / "transfer"
    subprocess.run(
        [
            sys.executable,
            "benchmarks/gpu/gpu_run.py",
            "prepare",
            "--payload",
            str(transfer),
            "--datasets",
            "ml-100k",
        ],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
    )
    assert (transfer / "part1" / "SmolLM2-135M-Instruct.Q4_1.gguf.part0").is_file()
    out = tmp_path / "out"
    command = ["bash", "benchmarks/gpu/run.sh", "--out", str(out), "--dry-run",
               "--payload", str(transfer / "payload"), "--datasets", "ml-100k",
               "--strategies", "mean", "centroid_gti"]  # fmt: skip
    first = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
    assert "byte-identical" in first.stdout
    files = sorted(p.name for p in out.iterdir())
    assert files == ["cuda_tests.txt", "run.log", "runs.tar.gz", "summary.json", "summary.md"]
    assert all(p.is_file() and p.stat().st_size < 16 * 2**20 for p in out.iterdir())  # the device's limits
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dry_run"] and summary["plan"]["device"] == "cpu"
    phases = summary["phases"]
    assert all(
        phases[k]["status"] == "done"
        for k in ("model", "cuda_tests", "quality/ml-100k/seed0", "adapter_bench")
    )
    assert "skipped" in phases["cuda_tests"]["line"]  # no CUDA here: every CUDA test skips
    runs = summary["quality"]["ml-100k"]["runs"]
    assert sorted(runs) == ["centroid_gti", "mean"]
    for records in runs.values():
        assert records[0]["metrics"]["test"]["decoding"]["invalid"] == 0
    assert sorted(r["method"] for r in summary["adapter"]) == ["floor", "full", "grounded", "trainable"]
    text = (out / "summary.md").read_text()
    assert "DRY RUN" in text and "| centroid_gti |" in text and "| fp32 | grounded |" in text
    with tarfile.open(out / "runs.tar.gz") as tar:
        names = tar.getnames()
    assert "state.json" in names and any(n.endswith("/mean-seed0/metrics.json") for n in names)
    assert not any("checkpoint-" in n or n.endswith(".safetensors") for n in names)

    second = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-4000:]
    assert "CUDA tests: done earlier" in second.stdout and "adapter benchmark: done earlier" in second.stdout
    assert "start quality" not in second.stdout
    assert json.loads((out / "summary.json").read_text())["quality"] == summary["quality"]
