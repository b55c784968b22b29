"""Memory per rank under sharding: the grounded rows (and a LoRA), their optimiser state and the frozen weights,
one process vs DDP, FSDP2 and DeepSpeed ZeRO-3 on two CPU processes (gloo).

Runs tests/helpers/sharded_run.py (SmolLM2-135M; a toy catalogue whose SID vocabulary has ``--index ITEMS LEVELS CODES``
tokens) for ``--steps`` steps under each launcher with the shipped examples/accelerate configs (process count 2,
precision fp32), and reads every rank's ``rank{R}.json``: bytes of the tensors the rank holds (FSDP2's local
shards, ZeRO-3's partitions, or whole tensors), of the optimiser's Adam moments (plus master copies where the
optimiser keeps its own), and the process's peak RSS. Prints a markdown table; ``--json`` writes the rows.

    python benchmarks/bench_sharding.py                                # grounding: the rows alone
    python benchmarks/bench_sharding.py --job sft:smollm2:tied         # rows + LoRA (r=2, all linear layers)
    python benchmarks/bench_sharding.py --setups single fsdp --index 256 2 64
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

try:
    from benchmarks._args import parse
except ModuleNotFoundError:  # run as a file: its folder is on sys.path, not the repository
    from _args import parse

ROOT = Path(__file__).resolve().parent.parent
RUNNER = ROOT / "tests" / "helpers" / "sharded_run.py"
CONFIGS = ROOT / "examples" / "accelerate"
SETUPS = {  # setup -> accelerate config (None: one plain process)
    "single": None,
    "ddp": "ddp_cpu_2proc.yaml",
    "fsdp": "fsdp.yaml",
    "zero3": "deepspeed_zero3.yaml",
}
MIB = 2**20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(setup: str, out: Path, args) -> list[str]:
    runner = [
        str(RUNNER),
        str(out),
        args.job,
        "--max-steps",
        str(args.steps),
        "--index",
        *map(str, args.index),
    ]
    if SETUPS[setup] is None:
        return [sys.executable, *runner, "--batch", str(2 * args.batch)]
    accelerate = shutil.which("accelerate", path=os.path.dirname(sys.executable)) or "accelerate"
    config = [
        "--config_file",
        str(CONFIGS / SETUPS[setup]),
        "--num_processes",
        "2",
        "--mixed_precision",
        "no",
    ]
    port = ["--main_process_port", str(free_port())]
    return [accelerate, "launch", *config, *port, *runner, "--batch", str(args.batch)]


def measure(setup: str, args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        result = subprocess.run(
            command(setup, Path(tmp), args),
            capture_output=True,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        if result.returncode != 0:
            raise SystemExit(f"{setup} failed:\n{result.stderr[-3000:]}")
        folder = Path(tmp) / args.job.replace(":", "-")
        ranks = [json.loads(p.read_text()) for p in sorted(folder.glob("rank*.json"))]
    return {
        "setup": setup,
        "ranks": len(ranks),
        "trainable_mib": max(r["trainable_bytes"] for r in ranks) / MIB,
        "optimizer_mib": max(r["optimizer_state_bytes"] + r["master_bytes"] for r in ranks) / MIB,
        "frozen_mib": max(r["frozen_bytes"] for r in ranks) / MIB,
        "peak_rss_mib": max(r["peak_rss_mib"] for r in ranks),
        "seconds": time.perf_counter() - start,
    }


def table(rows: list[dict]) -> str:
    base = rows[0]
    lines = [
        "| setup | processes | trainable (rows, LoRA) / rank (MiB) | Adam state / rank (MiB) | frozen weights / rank (MiB) "
        "| peak RSS / rank (MiB) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        share = f" ({r['trainable_mib'] / base['trainable_mib']:.2f}x)" if base["trainable_mib"] else ""
        lines.append(
            f"| {r['setup']} | {r['ranks']} | {r['trainable_mib']:.3f}{share} | {r['optimizer_mib']:.3f} "
            f"| {r['frozen_mib']:.1f} | {r['peak_rss_mib']:.0f} |"
        )
    return "\n".join(lines)


@dataclass
class Settings:
    job: str = field(
        default="grounding:smollm2:tied", metadata={"help": "tests/helpers/sharded_run.py's JOB"}
    )
    setups: list[str] = field(
        default_factory=lambda: list(SETUPS), metadata={"help": "launchers compared", "choices": list(SETUPS)}
    )
    index: list[int] = field(
        default_factory=lambda: [1024, 3, 256], metadata={"help": "the toy SID index: ITEMS LEVELS CODES"}
    )
    steps: int = field(default=2, metadata={"help": "training steps under each launcher"})
    batch: int = field(default=2, metadata={"help": "per process (one process: twice that)"})
    json: Path | None = field(default=None, metadata={"help": "write the rows here too"})

    def __post_init__(self) -> None:
        if len(self.index) != 3:
            raise SystemExit(f"--index takes ITEMS LEVELS CODES, got {self.index}")


def main(argv=None) -> None:
    args = parse(Settings, argv, prog="bench_sharding.py", description=__doc__)
    rows = []
    for setup in args.setups:
        rows.append(measure(setup, args))
        print(f"{setup}: {rows[-1]['seconds']:.0f} s", file=sys.stderr)
    print(table(rows))
    if args.json:
        args.json.write_text(
            json.dumps({"args": {**vars(args), "json": str(args.json)}, "rows": rows}, indent=1)
        )


if __name__ == "__main__":
    main()
