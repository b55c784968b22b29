"""SIGKILL at random instants of a training run, in a loop: does ``--resume`` always end where an
uninterrupted run ends?

Each iteration starts ``peft-grounded ground`` on a tiny model (a checkpoint every step, so kills land in
checkpoint writes, checkpoint rotation and the final adapter write as often as in training steps), SIGKILLs
it at a random point, starts it again with ``--resume`` and kills that too (``--kills`` times in all), then
resumes it to the end. A kill point is drawn per attempt: a checkpoint still to come, drawn uniformly (or
the attempt's start: model loading and data preparation), plus a delay drawn uniformly within one step of
the uninterrupted run; the points follow the attempt's own progress, so a loaded machine does not push every
kill into the set-up. It checks that the last resume succeeds, stops at the step limit, leaves every
checkpoint complete and no temporary file or lock behind, and that the adapter equals the uninterrupted
run's. A markdown table goes to stdout; the exit code is 1 if any iteration failed.

    python benchmarks/bench_kill_resume.py                      # 20 iterations, 2 kills each, kill seed 0
    python benchmarks/bench_kill_resume.py -n 50 --kills 3 --steps 10 --kill-seed 1
    python benchmarks/bench_kill_resume.py --subprocess         # fresh interpreters instead of forks

By default each attempt is a fork of this process with everything imported (the command starts at
``peft_grounded.cli.main``), so a kill falls in the command's own work; ``--subprocess`` runs
``python -m peft_grounded.cli`` instead (slower: imports dominate each attempt).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

try:
    from benchmarks._args import parse
except ModuleNotFoundError:  # run as a file: its folder is on sys.path, not the repository
    from _args import parse

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

GENRES = ("comedy", "horror", "drama", "western")


def make_world(root: Path, n_items: int = 24, n_users: int = 16) -> list[str]:
    """A tiny Llama (2 layers, 64 wide, SmolLM2's tokenizer), a synthetic catalogue and its SID index; returns
    the data arguments of the commands."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    from peft_grounded import assets
    from peft_grounded.sids import Catalogue, Item, build_sids

    rng = np.random.default_rng(0)
    items = {
        str(i): Item(str(i), title=f"The {GENRES[i % 4].title()} Story {i}", categories=(GENRES[i % 4],))
        for i in range(n_items)
    }
    sequences = {
        f"u{u}": tuple(str(int(rng.integers(n_items))) for _ in range(5 + u % 3)) for u in range(n_users)
    }
    catalogue = Catalogue("bench", items, sequences)
    centres = rng.normal(size=(4, 16)) * 3
    vectors = np.asarray([centres[i % 4] + rng.normal(size=16) for i in range(n_items)], dtype=np.float32)
    build_sids(catalogue, root / "sids", vectors=vectors, levels=2, codes=4, show_progress=False,
               encoder_fingerprint={"kind": "bench", "model": "clusters"})  # fmt: skip
    lcrec = {i: {"title": it.title, "categories": ", ".join(it.categories)} for i, it in items.items()}
    (root / "bench.item.json").write_text(json.dumps(lcrec))
    (root / "bench.inter.json").write_text(json.dumps({u: list(s) for u, s in sequences.items()}))
    tokenizer = AutoTokenizer.from_pretrained(assets.smollm2())
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(root / "base")
    tokenizer.save_pretrained(root / "base")
    return [
        "--model_name_or_path",
        str(root / "base"),
        "--sid-index",
        str(root / "sids"),
        "--catalogue",
        str(root / "bench"),
    ]


class Attempt:
    """One ``peft-grounded`` command in a fork (or a fresh interpreter), its output in a log file."""

    def __init__(self, argv: list[str], log: Path, fresh: bool) -> None:
        self.log, self.proc = log, None
        with open(log, "ab") as out:
            if fresh:
                command = [sys.executable, "-m", "peft_grounded.cli", *argv]
                self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
                self.pid = self.proc.pid
                return
            self.pid = os.fork()
            if self.pid == 0:
                code = 1
                try:
                    os.dup2(out.fileno(), 1)
                    os.dup2(out.fileno(), 2)
                    from peft_grounded.cli import main

                    code = main(argv)
                except BaseException:
                    traceback.print_exc()
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(code)

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit code (negative: killed by that signal), or None if still running after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self.proc is not None:
                code = self.proc.poll()
                if code is not None:
                    return code
            else:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    return os.waitstatus_to_exitcode(status)
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(0.005)

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)


def interrupted_at(out: Path) -> str:
    """What a kill interrupted, read from what it left in the run's folder."""
    partial = sorted(out.glob(".checkpoint-*.partial"))
    if partial:
        return f"writing {partial[-1].name.removeprefix('.').removesuffix('.partial')}"
    if list(out.glob(".adapter.*")):
        return "writing adapter/"
    if (out / "adapter").is_dir():
        return "after the end"
    steps = sorted(
        int(p.name.split("-")[1]) for p in out.glob("checkpoint-*") if p.name.split("-")[1].isdigit()
    )
    return f"after checkpoint-{steps[-1]}" if steps else "before the first checkpoint"


def newest_checkpoint(out: Path) -> int:
    """The step of the newest ``checkpoint-N`` (published whole: they appear by a rename), 0 if none."""
    steps = [int(p.name.split("-")[1]) for p in out.glob("checkpoint-*") if p.name.split("-")[1].isdigit()]
    return max(steps, default=0)


def kill_somewhere(
    attempt: Attempt, out: Path, rng: random.Random, steps: int, setup_s: float, step_s: float
) -> tuple[str, str]:
    """SIGKILL ``attempt`` after a random checkpoint still to come (0: from its start) plus a random delay
    within a step; returns the point and what the kill interrupted."""
    start = newest_checkpoint(out)
    target = rng.randint(start, steps)
    if target > start:
        while newest_checkpoint(out) < target:
            if attempt.wait(0) is not None:
                return f"after checkpoint-{target}", "finished before the kill"
            time.sleep(0.002)
        delay = rng.uniform(0, step_s)
        point = f"checkpoint-{target} + {delay:.2f} s"
    else:
        delay = rng.uniform(0, setup_s + step_s)  # model loading, data preparation, or the first step
        point = f"start + {delay:.2f} s"
    if attempt.wait(delay) is not None:
        return point, "finished before the kill"
    attempt.kill()
    attempt.wait()
    return point, interrupted_at(out)


def adapter_rows(out: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(out / "adapter" / "adapter_model.safetensors"))


def check_final(out: Path, steps: int, reference: dict) -> tuple[bool, str, float]:
    """Whether the finished run is whole and equal to the reference; a note on what is wrong; max |diff|."""
    from peft_grounded._io import lock_path
    from peft_grounded.training.runs import checkpoint_problem, checkpoints

    problems = []
    found = checkpoints(out)
    if not found or json.loads((found[-1] / "trainer_state.json").read_text())["global_step"] != steps:
        problems.append(f"last checkpoint {found[-1].name if found else None}, not checkpoint-{steps}")
    problems += [f"{c.name}: {checkpoint_problem(c)}" for c in found if checkpoint_problem(c)]
    leftovers = [
        p.name for p in out.iterdir() if p.name.startswith(".") and not p.name.endswith(".incomplete")
    ]
    problems += [f"left {name}" for name in leftovers]
    if lock_path(out).exists():
        problems.append("lock file left")
    rows = adapter_rows(out)
    diff = max(float((rows[k] - reference[k]).abs().max()) for k in reference)
    if rows.keys() != reference.keys() or diff > 1e-5:
        problems.append(f"adapter differs (max |diff| {diff:.2e})")
    return not problems, "; ".join(problems), diff


@dataclass
class Settings:
    iterations: int = field(default=20, metadata={"help": "kill-and-resume iterations", "aliases": ["-n"]})
    kills: int = field(default=2, metadata={"help": "killed attempts per iteration before the last resume"})
    steps: int = field(default=8, metadata={"help": "training steps (a checkpoint after each)"})
    kill_seed: int = field(  # not the run's --seed (RecommendationConfig's): the training run's is fixed
        default=0, metadata={"help": "seed of the kill points (not of the training run)"}
    )
    subprocess: bool = field(default=False, metadata={"help": "fresh interpreters instead of forks"})
    workdir: str | None = field(
        default=None, metadata={"help": "keep the runs here (None: a temporary folder)"}
    )


def parse_args(argv: list[str] | None = None) -> Settings:
    return parse(Settings, argv, prog="bench_kill_resume.py", description=__doc__)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    started = time.perf_counter()
    root = Path(args.workdir or tempfile.mkdtemp(prefix="bench_kill_resume-"))
    root.mkdir(parents=True, exist_ok=True)
    data = make_world(root)
    if not args.subprocess:  # the forks start with the command's imports done
        import peft_grounded.cli
        import peft_grounded.training.grounding  # noqa: F401
    common = ["--max_steps", str(args.steps), "--save_steps", "1", "--per_device_train_batch_size", "4"]
    common += ["--max_length", "96"]

    def command(out: Path, resume: bool) -> list[str]:
        resume_flags = ["--resume_from_checkpoint"] if resume else []
        return ["ground", *data, *common, "--output_dir", str(out), *resume_flags]

    t = time.perf_counter()
    straight = Attempt(command(root / "straight", False), root / "straight.log", args.subprocess)
    first_checkpoint = None  # when the first checkpoint appeared: training is under way
    while (code := straight.wait(0)) is None:
        if first_checkpoint is None and list((root / "straight").glob("*checkpoint-1*")):
            first_checkpoint = time.perf_counter() - t
        time.sleep(0.005)
    if code != 0:
        print(f"the uninterrupted run failed; see {root / 'straight.log'}", file=sys.stderr)
        return 1
    duration = time.perf_counter() - t
    first_checkpoint = first_checkpoint or 0.0
    step = (duration - first_checkpoint) / args.steps
    reference = adapter_rows(root / "straight")
    rng = random.Random(args.kill_seed)
    print(f"uninterrupted run: {duration:.1f} s ({args.steps} steps of {step:.2f} s, a checkpoint each; the "
          f"first checkpoint at {first_checkpoint:.1f} s); {args.iterations} iterations x {args.kills} "
          "kills\n")  # fmt: skip
    print(
        "| # | kill points | what each kill interrupted | last resume | final step | adapter max abs diff | ok |"
    )
    print("|---:|---|---|---:|---:|---:|---|")
    failures = 0
    for i in range(1, args.iterations + 1):
        out, log = root / f"run{i:03d}", root / f"run{i:03d}.log"
        points, states = [], []
        for k in range(args.kills):
            attempt = Attempt(command(out, resume=k > 0), log, args.subprocess)
            point, state = kill_somewhere(attempt, out, rng, args.steps, first_checkpoint, step)
            points.append(point)
            states.append(state)
        t = time.perf_counter()
        code = Attempt(command(out, resume=True), log, args.subprocess).wait()
        resume_s = time.perf_counter() - t
        ok, note, diff = (
            check_final(out, args.steps, reference) if code == 0 else (False, f"exit {code}", float("nan"))
        )
        failures += not ok
        state = (
            json.loads((out / f"checkpoint-{args.steps}" / "trainer_state.json").read_text())["global_step"]
            if ok
            else "-"
        )
        print(f"| {i} | {'; '.join(points)} | {'; '.join(states)} | {code} ({resume_s:.1f} s) | {state} | "
              f"{diff:.1e} | {'yes' if ok else 'NO: ' + note} |", flush=True)  # fmt: skip
    total = time.perf_counter() - started
    print(f"\n{args.iterations - failures}/{args.iterations} iterations resumed to the uninterrupted run's "
          f"adapter; {total:.0f} s wall; runs in {root}")  # fmt: skip
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
