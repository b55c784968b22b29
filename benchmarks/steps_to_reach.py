"""Steps each strategy needs to reach the reference's final progressive loss, per seed ("converges faster").

    python benchmarks/steps_to_reach.py --reference mean=runs/s0/mean,runs/s1/mean \\
        --run centroid=runs/s0/centroid,runs/s1/centroid [--run NAME=DIR,DIR ...]

Each DIR is a ``peft-grounded sft`` output (its ``log_history.json``); the i-th directory of every name is
seed i. The progressive loss is the NLL per item target of each logging window, on targets the model has
not trained on yet (within the first epoch). For every seed: the reference's last logged value, the
first logged step at which the run is at or below it, and how many fewer steps that is than the
reference's total. Also each run's total steps and training seconds, since time budgets give runs under
different machine load different step counts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

try:
    from benchmarks._args import REPEATABLE, parse
except ModuleNotFoundError:  # run as a file: its folder is on sys.path, not the repository
    from _args import REPEATABLE, parse


def curve(run: Path) -> list[dict]:
    """The logged windows (with ``item_nll``) of a run, in step order."""
    path = run / "log_history.json"
    if not path.is_file():
        raise SystemExit(f"{path} not found: pass the output directory of `peft-grounded sft`")
    return [e for e in json.loads(path.read_text()) if "item_nll" in e]


def steps_to_reach(entries: list[dict], level: float) -> int | None:
    """The first logged step whose progressive loss is at or below ``level`` (None: never)."""
    return next((e["step"] for e in entries if e["item_nll"] <= level), None)


def _named(value: str) -> tuple[str, list[Path]]:
    name, sep, dirs = value.partition("=")
    if not sep or not name or not dirs:
        raise SystemExit(f"{value!r}: write NAME=DIR[,DIR...] (one directory per seed)")
    return name, [Path(d) for d in dirs.split(",")]


@dataclass
class Settings:
    reference: str = field(metadata={"help": "NAME=DIR[,DIR...]: the reference, one directory per seed"})
    run: list[str] = field(metadata={"help": "NAME=DIR[,DIR...]; repeatable"} | REPEATABLE)

    def __post_init__(self) -> None:
        self.named_reference = _named(self.reference)
        self.named_runs = [_named(run) for run in self.run]


def main(argv: list[str] | None = None) -> None:
    args = parse(Settings, argv, prog="steps_to_reach.py", description=__doc__)
    ref_name, ref_dirs = args.named_reference
    lines = [
        f"| run | seed | steps | training s | steps to {ref_name}'s final progressive loss | fewer steps |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for seed, ref_dir in enumerate(ref_dirs):
        ref = curve(ref_dir)
        level, total = ref[-1]["item_nll"], ref[-1]["step"]
        seconds = ref[-1].get("seconds", float("nan"))
        lines.append(f"| {ref_name} | {seed} | {total} | {seconds:.0f} | {level:.2f} (its final) | |")
        for name, dirs in args.named_runs:
            if seed >= len(dirs):
                continue
            entries = curve(dirs[seed])
            reached = steps_to_reach(entries, level)
            fewer = f"{1 - reached / total:.0%}" if reached is not None else "not reached"
            lines.append(
                f"| {name} | {seed} | {entries[-1]['step']} | {entries[-1].get('seconds', float('nan')):.0f} | "
                f"{reached if reached is not None else '-'} | {fewer} |"
            )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
