"""One strategy trained under several recipes (one demo folder each, ``bench_demo_recipe.py``): one table of
its Recall@10, NDCG@10 and constrained NLL on the same users, each paired against a reference recipe.

    python benchmarks/recipe_table.py base=runs/recipe-base full-head=runs/recipe-full-head \\
        layers-4=runs/recipe-l4 --strategy centroid --part valid --reference base

Reads each folder's ``strategies/<strategy>-seed<N>/metrics.json`` (the runner's per-user records) and its SFT
log (steps, epochs, training seconds) and gives, per recipe, the means and the paired difference to the
reference recipe (users resampled, ``evaluation.reports.paired_intervals``). Every recipe must have scored
the same users of ``--part`` (the same split and seed).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from peft_grounded.evaluation.reports import paired_intervals, user_values
from peft_grounded.intervals import bootstrap_interval

try:
    from benchmarks._args import parse
except ModuleNotFoundError:  # run as a file: its folder is on sys.path, not the repository
    from _args import parse

METRICS = ("recall@10", "ndcg@10", "constrained_nll")


@dataclass
class Settings:
    recipes: list[str] = field(
        default_factory=list,
        metadata={"help": "LABEL=FOLDER: a demo output folder per recipe (also positional)"},
    )
    strategy: str = field(default="centroid", metadata={"help": "the strategy compared across recipes"})
    part: Literal["valid", "test"] = field(default="valid", metadata={"help": "the users compared"})
    reference: str | None = field(
        default=None, metadata={"help": "the recipe every other one is paired with (None: the first)"}
    )

    def __post_init__(self) -> None:
        if not self.recipes:
            raise SystemExit("give the recipes as LABEL=FOLDER LABEL=FOLDER ...")


def parse_args(argv=None) -> Settings:
    return parse(Settings, argv, prog="recipe_table.py", description=__doc__, positionals=(("recipes", "*"),))


def recipe(folder: Path, strategy: str, part: str) -> dict:
    """The per-user records of ``part`` and the SFT stage's steps, epochs and seconds of one recipe."""
    found = sorted((folder / "strategies").glob(f"{strategy}-seed*/metrics.json"))
    if len(found) != 1:
        raise SystemExit(
            f"{folder}: expected one finished run of {strategy!r} (strategies/{strategy}-seed<N>/), found {len(found)}"
        )
    metrics = json.loads(found[0].read_text())
    if part not in metrics["users"]:
        raise SystemExit(f"{found[0]}: no {part!r} users (run bench_demo_recipe.py with --eval-parts {part})")
    log = json.loads((found[0].parent / "sft" / "log_history.json").read_text())
    last = [row for row in log if "loss" in row][-1]
    return {
        "users": metrics["users"][part],
        "steps": last["step"],
        "epochs": last["epoch"],
        "seconds": last["seconds"],
        "threads": metrics.get("threads"),
    }


def recall_with_interval(users: list[dict]) -> str:
    """Recall@10 over ``users`` with its 95% bootstrap interval."""
    row = bootstrap_interval([list(user_values(users, "recall@10").values())])
    return f"{row['difference']:.4f} [{row['low']:.3f}, {row['high']:.3f}]"


def main(argv=None) -> None:
    args = parse_args(argv)
    recipes = {}
    for item in args.recipes:
        label, sep, folder = item.partition("=")
        if not sep or not folder:
            raise SystemExit(f"{item!r}: give each recipe as LABEL=FOLDER")
        recipes[label] = recipe(Path(folder), args.strategy, args.part)
    reference = args.reference or next(iter(recipes))
    if reference not in recipes:
        raise SystemExit(f"--reference {reference!r} is not one of {sorted(recipes)}")
    ref = recipes[reference]
    print(f"{args.strategy}, {args.part} users: {len(ref['users'])}; paired against {reference}")
    print(
        "| recipe | SFT steps | epochs | SFT min | s/step | threads | R@10 [95% CI] | NDCG@10 | constrained NLL "
        f"| R@10 - {reference} | NDCG@10 - {reference} | NLL - {reference} |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|")
    for label, run in recipes.items():
        means = [np.mean(list(user_values(run["users"], m).values())) for m in METRICS]
        cells = [
            label,
            str(run["steps"]),
            f"{run['epochs']:.2f}",
            f"{run['seconds'] / 60:.1f}",
            f"{run['seconds'] / max(run['steps'], 1):.2f}",
            str(run["threads"]),
            recall_with_interval(run["users"]),
            f"{means[1]:.4f}",
            f"{means[2]:.3f}",
        ]
        if label == reference:
            cells += ["", "", ""]
        else:
            rows = paired_intervals([run["users"]], [ref["users"]], list(METRICS))
            cells += [
                f"{r['difference']:+.4f} [{r['low']:+.4f}, {r['high']:+.4f}]"
                for r in (rows[m] for m in METRICS)
            ]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
