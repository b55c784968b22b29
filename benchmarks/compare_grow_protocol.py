"""Two runs of the new-item protocol (``bench_grow_protocol.py``) that differ in one setting, paired per user.

    python benchmarks/compare_grow_protocol.py runs/grow-ml-behaviour runs/grow-ml-text \
        --models "grown + served, beams chosen on the log" "text KNN (last item)"

Both runs must score the same users with the same targets (same dataset, ``--share``, ``--positions`` and
seed; e.g. ``--item-vectors behaviour`` against ``text``). For each model both runs scored: the first run's
Recall@K minus the second's, paired per user, on the new-item users, on the old-item users, and on all users
(the two groups weighted by the new-item users' share of the population, stratified bootstrap:
``new_items.blended``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from peft_grounded.intervals import bootstrap_interval

try:
    from benchmarks._args import parse
    from benchmarks.new_item_protocol import blended
    from benchmarks.pool_grow_protocol import per_user
except ModuleNotFoundError:  # run as a file: its folder is on sys.path, not the repository
    from _args import parse
    from new_item_protocol import blended
    from pool_grow_protocol import per_user

GROUPS = (("new", "rank_of_target", "users"), ("old", "old_item_rank_of_target", "old_item_users"))


def load_pair(first: str, second: str) -> tuple[dict, dict]:
    runs = [json.loads((Path(d) / "protocol.json").read_text()) for d in (first, second)]
    a, b = (r["per_user"] for r in runs)
    for key in ("users", "targets", "old_item_users"):
        if a[key] != b[key]:
            raise SystemExit(
                f"{first} and {second} score other users or targets ({key}): compare runs of one dataset, "
                "--share, --positions and seed"
            )
    return runs[0], runs[1]


def compare(
    first: dict, second: dict, models: list[str] | None, k: int, resamples: int, seed: int = 0
) -> dict:
    """Per model: each run's Recall@K per group, and first - second paired per user (new, old, all users)."""
    ranks = [r["per_user"] for r in (first, second)]
    common = [m for m in ranks[0]["rank_of_target"] if m in ranks[1]["rank_of_target"]]
    common = [
        m
        for m in common
        if m in ranks[0]["old_item_rank_of_target"] and m in ranks[1]["old_item_rank_of_target"]
    ]
    chosen = models or common
    missing = sorted(set(chosen) - set(common))
    if missing:
        raise SystemExit(f"--models {missing} are not scored by both runs; they have: {common}")
    weight = first["new_item_test_users"] / (first["new_item_test_users"] + first["old_item_users"]["of"])
    metric = f"recall@{k}"
    table = {}
    for model in chosen:
        row: dict[str, list[float]] = {}
        diffs = {}
        for group, key, _ in GROUPS:
            values = [per_user(r[key][model], metric) for r in ranks]
            row[f"{group}_first"] = [float(values[0].mean())]
            row[f"{group}_second"] = [float(values[1].mean())]
            diffs[group] = values[0] - values[1]
            found = bootstrap_interval([diffs[group]], resamples=resamples, seed=seed)
            row[f"{group}_difference"] = [found["difference"], found["low"], found["high"]]
        row["all_difference"] = list(blended(diffs["new"], diffs["old"], weight, seed, resamples))
        table[model] = row
    return {
        "runs": [first["budget"]["out"], second["budget"]["out"]],
        "dataset": first["dataset"],
        "new_item_users": len(ranks[0]["users"]),
        "old_item_users": len(ranks[0]["old_item_users"]),
        "new_item_share": weight,
        "resamples": resamples,
        "models": table,
    }


def markdown(result: dict, k: int) -> str:
    a, b = (Path(r).name for r in result["runs"])
    signed = "{:+.4f} [{:+.4f}, {:+.4f}]"
    lines = [
        f"## {a} - {b} on {result['dataset']}: {result['new_item_users']} new-item users, "
        f"{result['old_item_users']} old-item users ({result['new_item_share']:.1%} of all users have a new-item "
        "target)",
        "",
        f"| model | new-item users, R@{k} ({a} / {b}) | difference | old-item users ({a} / {b}) | difference "
        "| all users, difference |",
        "|---|---|---|---|---|---|",
    ]
    for model, row in result["models"].items():
        lines.append(
            f"| {model} | {row['new_first'][0]:.4f} / {row['new_second'][0]:.4f} | "
            f"{signed.format(*row['new_difference'])} | {row['old_first'][0]:.4f} / {row['old_second'][0]:.4f} | "
            f"{signed.format(*row['old_difference'])} | {signed.format(*row['all_difference'])} |"
        )
    lines += [
        "",
        f"Paired per user; percentile bootstrap ({result['resamples']:,} resamples); all users: the groups "
        "weighted by their shares, resampled within each group.",
    ]
    return "\n".join(lines) + "\n"


@dataclass
class Settings:
    runs: list[str] = field(
        default_factory=list,
        metadata={"help": "two output folders of bench_grow_protocol.py (also positional)"},
    )
    models: list[str] | None = field(
        default=None, metadata={"help": "models to compare (None: all common ones)"}
    )
    k: int = field(default=10, metadata={"help": "the cut-off K of Recall@K"})
    resamples: int = field(default=10_000, metadata={"help": "bootstrap resamples"})

    def __post_init__(self) -> None:
        if len(self.runs) != 2:
            raise SystemExit(f"give two runs (the first minus the second), got {len(self.runs)}")


def main(argv=None) -> None:
    args = parse(
        Settings, argv, prog="compare_grow_protocol.py", description=__doc__, positionals=(("runs", "*"),)
    )
    result = compare(*load_pair(*args.runs), args.models, args.k, args.resamples)
    print(markdown(result, args.k))


if __name__ == "__main__":
    main()
