"""How long ``peft-grounded --help`` and each ``peft-grounded COMMAND --help`` take, the whole process timed, with
``trl sft --help`` beside them as the control.

    python benchmarks/bench_cli_help.py              # every command, 5 rounds (after one warm-up round)
    python benchmarks/bench_cli_help.py --runs 10 --no-control --commands build-sids evaluate demo

Each run is a fresh interpreter (``python -m peft_grounded.cli COMMAND --help``; the control: TRL's console
script ``trl sft --help``; and ``python -c pass``, the interpreter's start, which shows how busy the machine is), timed from its start to its exit. The commands are interleaved round by round, so
that other jobs on the machine slow every row alike; the table gives the min, median and max wall seconds, and
the load average before and after. The target: under 1 s for the command list and every command whose
settings need no TRL ``SFTConfig``; ``ground``, ``sft`` and ``evaluate`` no slower than the control.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

try:
    from benchmarks._args import parse
except ModuleNotFoundError:  # run as a file: its folder is on sys.path, not the repository
    from _args import parse


def _commands() -> tuple[str, ...]:
    """The top level ("") and every command the CLI has, in its order."""
    from peft_grounded.cli import COMMANDS as registered

    return ("", *registered)


COMMANDS = _commands()
CONTROL = "trl sft --help (control)"
START = "python -c pass (interpreter start)"


def argv_of(command: str) -> list[str]:
    if command == CONTROL:
        trl = shutil.which("trl") or os.path.join(os.path.dirname(sys.executable), "trl")
        return [trl, "sft", "--help"]
    if command == START:
        return [sys.executable, "-c", "pass"]
    return [sys.executable, "-m", "peft_grounded.cli", *([command] if command else []), "--help"]


def time_rounds(commands: list[str], runs: int, warmup: int = 1) -> dict[str, list[float]]:
    """Wall seconds of ``runs`` fresh ``--help`` processes per command, interleaved (after ``warmup`` rounds)."""
    seconds: dict[str, list[float]] = {c: [] for c in commands}
    for i in range(warmup + runs):
        for command in commands:
            start = time.perf_counter()
            subprocess.run(argv_of(command), check=True, capture_output=True)
            if i >= warmup:
                seconds[command].append(time.perf_counter() - start)
    return seconds


def row(name: str, seconds: list[float]) -> str:
    return f"| {name} | {min(seconds):.2f} | {statistics.median(seconds):.2f} | {max(seconds):.2f} | {len(seconds)} |"


@dataclass
class Settings:
    runs: int = field(default=5, metadata={"help": "timed rounds (after one warm-up round)"})
    no_control: bool = field(default=False, metadata={"help": "leave out trl sft --help"})
    commands: list[str] | None = field(
        default=None,
        metadata={"help": "only these commands (and the controls)", "choices": [c for c in COMMANDS if c]},
    )


def main(argv: list[str] | None = None) -> None:
    args = parse(Settings, argv, prog="bench_cli_help.py", description=__doc__)
    chosen = [c for c in COMMANDS if args.commands is None or c in args.commands]
    commands = [START, *chosen, *([] if args.no_control else [CONTROL])]
    load = os.getloadavg()
    seconds = time_rounds(commands, args.runs)
    print(f"load average before: {load[0]:.2f}, after: {os.getloadavg()[0]:.2f}; {os.cpu_count()} CPUs")
    print("| command | min s | median s | max s | runs |")
    print("|---|---:|---:|---:|---:|")
    for command in commands:
        name = (
            command if command in (CONTROL, START) else f"`peft-grounded {command} --help`".replace("  ", " ")
        )
        print(row(name, seconds[command]), flush=True)


if __name__ == "__main__":
    main()
