"""One table of arms (demo runs that differ in one lever, same strategy and seed) paired per user against a
reference arm, on the part each decoded (validation for the ablations of issue 40).

    python benchmarks/pool_arms.py --part valid text=runs/i40/text-s0 behaviour=runs/i40/behaviour-s0

The first arm is the reference. Each arm's folder holds one strategy run (``strategies/<name>-seed<N>/
metrics.json``, the runner's per-user records) or is a ``peft-grounded evaluate`` output (``users.json``); an
arm may also be a peer's file of ``benchmarks/bench_side_by_side.py`` (``<out>/peers/seed<N>/sasrec.json``: test users
only, no likelihood, so the NLL columns are left out). Arms given as ``NAME=DIR1,DIR2`` pool seeds (users
resampled within each seed, ``evaluation.reports.paired_intervals``); ``--subset warm`` / ``cold`` keeps the
users whose target is a warm / cold item.

    python benchmarks/pool_arms.py --part test sasrec=runs/sbs/peers/seed0/sasrec.json llm=runs/i40/test-behaviour-s0

A one-run-per-arm interval resamples users, not trainings. ``--repeats A:B ...`` names pairs of runs of one
recipe at one seed (scored on the same users); their differences give one training run's spread
(``intervals.run_spread``), and every interval then carries it too.

    python benchmarks/pool_arms.py --part test recipe=runs/i53/test-ctl-s0,runs/i53/test-ctl-s1 \
        hour=runs/i52/test-h60-s0,runs/i52/test-h60-s1 \
        --repeats runs/i53/test-ctl-s0:runs/i52/test-rec-s0 runs/i53/test-ctl-s1:runs/i52/test-rec-s1
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from peft_grounded.evaluation.reports import paired_intervals, user_values
from peft_grounded.intervals import run_spread

try:
    from benchmarks._args import parse
    from benchmarks.pool_demo_runs import in_subset
except ModuleNotFoundError:  # run as a file: its folder is on sys.path, not the repository
    from _args import parse
    from pool_demo_runs import in_subset

METRICS = ("recall@10", "ndcg@10", "constrained_nll")


def arm_records(folder: Path, part: str) -> list[dict]:
    """The per-user records of the one strategy run in ``folder``, of a ``peft-grounded evaluate`` output
    folder (its ``users.json``), or of a side-by-side peer file (test users only)."""
    if folder.is_file():
        peer = json.loads(folder.read_text())
        if "records" not in peer:
            raise SystemExit(f"{folder}: not a peer file of side_by_side.py (it has no 'records')")
        if part != "test":
            raise SystemExit(f"{folder}: a peer file holds test users only; use --part test")
        return peer["records"]
    if (folder / "users.json").is_file():
        runs, users = [folder / "users.json"], json.loads((folder / "users.json").read_text())
    else:
        runs = sorted(folder.glob("strategies/*/metrics.json"))
        if len(runs) != 1:
            raise SystemExit(f"{folder}: expected one strategy run or a users.json, found {len(runs)} runs")
        users = json.loads(runs[0].read_text())["users"]
    if part not in users:
        raise SystemExit(f"{runs[0]} holds no {part!r} records (parts: {', '.join(users)})")
    return users[part]


def training(folder: Path) -> str:
    """``steps (epochs), seconds`` of the arm's SFT, from its log (an evaluate folder: its ``run`` link); a
    peer file: its training minutes."""
    if folder.is_file():
        peer = json.loads(folder.read_text())
        return f"best epoch {peer.get('best_epoch', '?')}, {60 * float(peer.get('minutes', 0)):.0f} s"
    run = folder / "run"
    logs = sorted((run.resolve() if run.exists() else folder).glob("strategies/*/sft/log_history.json"))
    if not logs:
        return ""
    log = json.loads(logs[0].read_text())
    last = next((e for e in reversed(log) if "epoch" in e and "step" in e), {})
    seconds = next((e["seconds"] for e in reversed(log) if "seconds" in e), None)
    return f"{last.get('step', '?')} ({float(last.get('epoch', 0)):.2f}), {seconds} s"


def training_spread(pairs: list[str], part: str, subset: str, metrics: tuple[str, ...]) -> dict[str, float]:
    """metric -> one training run's spread (``intervals.run_spread``) from ``DIR_A:DIR_B`` repeat pairs."""
    folders = []
    for pair in pairs:
        a, sep, b = pair.partition(":")
        if not sep or not a or not b:
            raise SystemExit(
                f"--repeats takes DIR_A:DIR_B (two runs of one recipe at one seed), got {pair!r}"
            )
        folders.append((Path(a), Path(b)))
    runs = [[in_subset(arm_records(f, part), subset) for f in pair] for pair in folders]
    return {
        metric: run_spread([seed_differences([a], [b], metric)[0] for a, b in runs]) for metric in metrics
    }


def seed_differences(arm: list[list[dict]], reference: list[list[dict]], metric: str) -> list[float]:
    """Each seed's mean paired difference (``arm`` minus ``reference`` over the users both hold): where the
    seeds disagree, a pooled interval that resamples users alone hides it."""
    differences = []
    for runs, refs in zip(arm, reference, strict=True):
        ours, theirs = user_values(runs, metric), user_values(refs, metric)
        common = ours.keys() & theirs.keys()
        if not common:
            raise SystemExit(f"no user is in both arms' records for one seed ({metric})")
        differences.append(sum(ours[u] - theirs[u] for u in common) / len(common))
    return differences


@dataclass
class Settings:
    arms: list[str] = field(
        default_factory=list,
        metadata={"help": "NAME=DIR[,DIR...] (also positional); the first is the reference"},
    )
    part: Literal["valid", "test"] = field(default="valid", metadata={"help": "the users compared"})
    subset: Literal["all", "warm", "cold"] = field(
        default="all",
        metadata={
            "help": "all: the seeded sample; warm: its users whose target is not a cold item; cold: every "
            "cold-target user (pool_demo_runs.in_subset)"
        },
    )

    repeats: list[str] = field(
        default_factory=list,
        metadata={
            "help": "DIR_A:DIR_B pairs, two runs of one recipe at one seed: their paired differences give one "
            "training run's spread, which every interval then carries (none: users resampled only)"
        },
    )

    def __post_init__(self) -> None:
        if not self.arms:
            raise SystemExit("give the arms as NAME=DIR[,DIR...] NAME=DIR[,DIR...] ...")


def main(argv=None) -> None:
    args = parse(Settings, argv, prog="pool_arms.py", description=__doc__, positionals=(("arms", "*"),))
    arms = {}
    for arm in args.arms:
        name, _, dirs = arm.partition("=")
        arms[name] = [Path(d) for d in dirs.split(",")]
    reference, *_ = arms
    records = {
        name: [in_subset(arm_records(d, args.part), args.subset) for d in folders]
        for name, folders in arms.items()
    }
    ref = records[reference]
    likelihood = all("constrained_nll" in r for runs in records.values() for run in runs for r in run)
    metrics = METRICS if likelihood else METRICS[:2]  # a peer's records rank items but hold no likelihood
    users = sum(len(run) for run in records[reference])
    spread = training_spread(args.repeats, args.part, args.subset, metrics) if args.repeats else None
    resampled = "users resampled within seed"
    if spread:
        sds = ", ".join(f"{m} {sd:.4f}" for m, sd in spread.items())
        resampled += (
            f", plus one training run's spread per arm and seed ({sds}; {len(args.repeats)} repeat pairs)"
        )
    print(
        f"{args.part}, {args.subset} users ({users} user-seeds), paired per user against {reference!r} (95% "
        f"intervals, {resampled})"
    )
    print(
        "| arm | SFT steps (epochs), seconds | "
        + " | ".join(metrics)
        + " | "
        + " | ".join(f"{m} minus {reference}" for m in metrics)
        + f" | {metrics[0]} minus {reference}, each seed |"
    )
    print("|---|---|" + "---:|" * (2 * len(metrics)) + "---|")
    for name, folders in arms.items():
        means = []
        for metric in metrics:
            values = [v for r in records[name] for v in user_values(r, metric).values()]
            means.append(f"{sum(values) / len(values):.4f}")
        cells = [""] * (len(metrics) + 1)
        if name != reference:
            intervals = paired_intervals(records[name], ref, metrics, run_sd=spread)
            cells = [
                f"{i['difference']:+.4f} [{i['low']:+.4f}, {i['high']:+.4f}]"
                for i in (intervals[m] for m in metrics)
            ]
            cells.append(" / ".join(f"{d:+.4f}" for d in seed_differences(records[name], ref, metrics[0])))
        print(f"| {name} | {'; '.join(training(d) for d in folders)} | " + " | ".join(means + cells) + " |")


if __name__ == "__main__":
    main()
