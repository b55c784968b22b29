"""Pool the strategies of several demo runs (one seed each, e.g. ``bench_demo_recipe.py --seed N``) into one
table of paired intervals against a reference strategy.

    python benchmarks/pool_demo_runs.py runs/demo runs/demo-seed1 runs/demo-seed2 --reference mean

``--peers sasrec popularity`` adds the peers each run scored (``peers/<name>.json``, the same users) as
rows, so that the LLM can be paired against them (``--reference sasrec``); ``--subset warm`` / ``cold``
keeps the sample's users whose target is not a cold item / every cold-target user (``all``: the seeded
sample; the runner scores the cold-target users outside it too). ``--evaluated last=runs/office-60-last`` adds a row from
``peft-grounded evaluate`` outputs (its ``users.json``; one folder per run, joined by commas), e.g. a
checkpoint of the run decoded on the same users. A seed whose strategies were trained in separate
folders (two at a time, one per core) is one run given as its folders joined by commas:
``runs/centroid-s0,runs/mean-s0``.

Reads each run's ``strategies/<name>-seed<N>/metrics.json`` (the runner's per-user records of the test
part) and gives, per strategy and metric, the seeds' mean and the paired difference to the reference with the
package's bootstrap (users resampled within each seed, ``evaluation.reports.paired_intervals``). Every run
must hold the reference and score the same users in it as in the other strategies.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from peft_grounded.evaluation.reports import paired_intervals, user_values
from peft_grounded.pipeline.demo import Preset

try:
    from benchmarks._args import ZeroOrMore, package_fields, parse
except ModuleNotFoundError:  # run as a file: its folder is on sys.path, not the repository
    from _args import ZeroOrMore, package_fields, parse

METRICS = ("recall@10", "ndcg@10", "constrained_nll")


@dataclass
class Settings:
    runs: list[str] = field(
        default_factory=list,
        metadata={
            "help": "demo output folders (each with strategies/<name>-seed<N>/; also positional); one seed's "
            "folders joined by commas"
        },
    )
    reference: str = field(default="mean", metadata={"help": "the strategy every other one is compared with"})
    part: str = field(default="test", metadata={"help": "the part whose users are compared"})
    evaluated: list[str] = field(
        default_factory=list,
        metadata={
            "help": "NAME=FOLDER[,FOLDER...]: rows from `peft-grounded evaluate` output folders (users.json), "
            "one folder per run",
            "action": ZeroOrMore,
        },
    )
    subset: Literal["all", "warm", "cold"] = field(
        default="all", metadata={"help": "the users whose target is any / a warm / a cold item"}
    )

    def __post_init__(self) -> None:
        if not self.runs:
            raise SystemExit("give the demo runs: RUN [RUN ...] (one seed each)")


# --peers: the demo's peers (Preset.peers), those of them the runs scored (peers/<name>.json) added as rows; none
# unless named here (the script's default), ``--peers`` alone none either
PeerFields = package_fields(Preset, "peers", parser={"peers": {"action": ZeroOrMore}})


def parse_args(argv=None) -> tuple[Settings, PeerFields]:
    """The settings and the peers parsed beside them under the demo's flag (``args, peers``)."""
    return parse(
        (Settings, PeerFields),
        argv,
        prog="pool_demo_runs.py",
        description=__doc__,
        positionals=(("runs", "*"),),
        defaults={"peers": []},
    )


def evaluated_records(spec: str, runs: list[str], part: str) -> tuple[str, list[list[dict]]]:
    """``NAME=FOLDER[,FOLDER...]`` -> the name and each run's per-user records of ``FOLDER/users.json``."""
    name, sep, folders = spec.partition("=")
    paths = [Path(f) / "users.json" for f in folders.split(",")] if sep and name and folders else []
    if len(paths) != len(runs):
        raise SystemExit(
            f"--evaluated {spec!r}: give NAME=FOLDER with one `peft-grounded evaluate` folder per run "
            f"({len(runs)} runs), joined by commas"
        )
    out = []
    for path in paths:
        if not path.is_file():
            raise SystemExit(f"{path}: not found (an output folder of `peft-grounded evaluate`?)")
        users = json.loads(path.read_text())
        if part not in users:
            raise SystemExit(f"{path} holds no {part!r} part (evaluate it with --splits {part})")
        out.append(users[part])
    return name, out


def records(
    runs: list[str], part: str, peers: Sequence[str] = (), evaluated: Sequence[str] = ()
) -> dict[str, list[list[dict]]]:
    """``strategy -> one per-user record list per run`` (only strategies every run holds), then ``peers``,
    then the ``evaluated`` rows."""
    found: dict[str, list[list[dict]]] = {}
    for spec in evaluated:
        name, per_run = evaluated_records(spec, runs, part)
        found[name] = per_run
    for run in runs:
        in_run: dict[str, list[dict]] = {}
        for peer in peers:
            path = Path(run.split(",")[0]) / "peers" / f"{peer}.json"
            if not path.is_file():
                raise SystemExit(f"{path}: no such peer in this run (run it with --peers {peer})")
            in_run[peer] = json.loads(path.read_text())["records"]
        for folder in run.split(","):
            finished = sorted((Path(folder) / "strategies").glob("*-seed*/metrics.json"))
            if not finished:
                raise SystemExit(
                    f"{folder} holds no finished strategy (strategies/<name>-seed<N>/metrics.json)"
                )
            for path in finished:
                name = path.parent.name.rsplit("-seed", 1)[0]
                if name in in_run:
                    raise SystemExit(
                        f"{run}: {name!r} is in more than one of its folders; give each strategy once per seed"
                    )
                in_run[name] = json.loads(path.read_text())["users"][part]
        for name, users in in_run.items():
            if any(spec.partition("=")[0] == name for spec in evaluated):
                raise SystemExit(f"--evaluated {name!r}: the runs already hold a row of that name")
            found.setdefault(name, []).append(users)
    return {name: recs for name, recs in found.items() if len(recs) == len(runs)}


def in_subset(users: list[dict], subset: str) -> list[dict]:
    """The records scored in ``subset``: ``all`` the seeded sample (``"all": True``), ``warm`` its users whose
    target is not cold, ``cold`` every cold-target user (the sample's and the extra ones the runner adds)."""
    if subset == "cold":
        return [r | {"all": True} for r in users if r["cold"]]
    return [r for r in users if r.get("all", True) and (subset == "all" or not r["cold"])]


def main(argv=None) -> None:
    args, peers = parse_args(argv)
    found = records(args.runs, args.part, peers.peers, args.evaluated)
    found = {n: [in_subset(run, args.subset) for run in runs] for n, runs in found.items()}
    if args.reference not in found:
        raise SystemExit(f"--reference {args.reference!r} is not in every run; found {sorted(found)}")
    reference = found[args.reference]
    print(
        f"{len(args.runs)} runs, {args.part} users: {[len(r) for r in reference]}; reference {args.reference}"
    )
    print("| strategy | metric | mean over runs | - reference | 95% interval |")
    print("|---|---|---:|---:|---|")
    for name, runs in found.items():
        for metric in METRICS:
            if any(metric.endswith("nll") and metric not in r for run in runs + reference for r in run):
                continue  # a peer without likelihoods (SASRec scores items, not SID tokens)
            mean = np.mean([np.mean(list(user_values(r, metric).values())) for r in runs])
            if name == args.reference:
                print(f"| {name} | {metric} | {mean:.4f} | | |")
                continue
            row = paired_intervals(runs, reference, [metric])[metric]
            print(
                f"| {name} | {metric} | {mean:.4f} | {row['difference']:+.4f} | "
                f"[{row['low']:+.4f}, {row['high']:+.4f}] |"
            )


if __name__ == "__main__":
    main()
