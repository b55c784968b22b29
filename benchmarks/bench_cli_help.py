"""How long ``peft-grounded --help`` and each ``peft-grounded COMMAND --help`` take, the whole process timed.

    python benchmarks/bench_cli_help.py              # every command, 5 runs each (after one warm-up run)
    python benchmarks/bench_cli_help.py --runs 10 --cold

Each run is a fresh interpreter (``python -m peft_grounded.cli COMMAND --help``), timed from its start to its
exit; the table gives the min, median and max wall seconds. ``--cold`` also times what the stage commands' help
costs once where no shipped snapshot fits the installed libraries: a fresh process rendering it (importing TRL),
before it is cached.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from peft_grounded._scripts import parse_script_args

COMMANDS = (
    "",
    "build-sids",
    "add-items",
    "grow-adapter",
    "ground",
    "sft",
    "evaluate",
    "diagnose",
    "push",
    "pull",
    "demo",
)


def time_help(command: str, runs: int, warmup: int = 1) -> list[float]:
    """Wall seconds of ``runs`` fresh ``--help`` processes of ``command`` (after ``warmup`` uncounted ones)."""
    argv = [sys.executable, "-m", "peft_grounded.cli", *([command] if command else []), "--help"]
    seconds = []
    for i in range(warmup + runs):
        start = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        if i >= warmup:
            seconds.append(time.perf_counter() - start)
    return seconds


def row(name: str, seconds: list[float]) -> str:
    return f"| {name} | {min(seconds):.2f} | {statistics.median(seconds):.2f} | {max(seconds):.2f} | {len(seconds)} |"


def time_render(command: str, runs: int) -> list[float]:
    """Wall seconds of fresh processes rendering ``command``'s help (what a missing snapshot costs once)."""
    code = f"from peft_grounded.cli.help import render; render({command!r})"
    seconds = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
        seconds.append(time.perf_counter() - start)
    return seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--cold", action="store_true", help="also time the stage commands without a snapshot")
    args = parse_script_args(parser, argv)
    print("| command | min s | median s | max s | runs |")
    print("|---|---:|---:|---:|---:|")
    for command in COMMANDS:
        print(
            row(f"`peft-grounded {command} --help`".replace("  ", " "), time_help(command, args.runs)),
            flush=True,
        )
    if args.cold:
        for command in ("ground", "sft", "evaluate"):
            print(
                row(f"`{command}` help rendered, no snapshot (once)", time_render(command, args.runs)),
                flush=True,
            )


if __name__ == "__main__":
    main()
