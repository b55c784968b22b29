"""Pool several seeds of the new-item protocol (``bench_grow_protocol.py``) into one table.

    python benchmarks/pool_grow_protocol.py runs/grow-office runs/grow-office-s1 \
        --out docs/results/office_new_items_two_seeds.md

Every run must score the same users with the same targets (same dataset, ``--share`` and ``--positions``;
the training seed is what differs). Per model: Recall/NDCG@K averaged over seeds, with the package's
stratified bootstrap (users resampled within each seed; ``intervals.bootstrap_interval``);
paired differences pair each user within each seed. ``--models`` restricts the table to models every run
scored the same way (e.g. to leave out a row whose method changed between the runs); ``--against`` pairs every
``grown + ...`` model with the models named (e.g. the text-only mixture and ``p_text`` alone).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from peft_grounded._io import atomic_write_text
from peft_grounded.evaluation.reports import user_value
from peft_grounded.intervals import bootstrap_interval

try:
    from benchmarks._args import parse
except ModuleNotFoundError:  # run as a file: its folder is on sys.path, not the repository
    from _args import parse


def per_user(ranks: list[int], metric: str) -> np.ndarray:
    """``metric`` (``recall@K`` / ``ndcg@K``) per user from the protocol's 1-based ranks (0: not in the
    top K), by the package's own per-user definition (0-based ranks there)."""
    return np.array([user_value({"rank": r - 1 if r else None}, metric) for r in ranks])


def load_runs(directories: list[str]) -> list[dict]:
    runs = [json.loads((Path(d) / "protocol.json").read_text()) for d in directories]
    first = runs[0]["per_user"]
    for directory, run in zip(directories[1:], runs[1:], strict=True):
        mine = run["per_user"]
        if (mine["users"], mine["targets"]) != (first["users"], first["targets"]):
            raise SystemExit(
                f"{directory} scores other users or targets than {directories[0]}: pool only runs of one "
                "dataset, --share and --positions (the training seed may differ)"
            )
    seeds = [run["budget"]["seed"] for run in runs]
    if len(set(seeds)) != len(seeds):
        raise SystemExit(f"the runs repeat a seed ({seeds}): pool runs of different training seeds")
    return runs


def pool(
    runs: list[dict], models: list[str] | None, k: int, resamples: int, against: list[str] | None = None
) -> dict:
    """Mean over seeds and pooled intervals of each model, and of the paired differences."""
    common = [
        m
        for m in runs[0]["per_user"]["rank_of_target"]
        if all(m in r["per_user"]["rank_of_target"] for r in runs)
    ]
    chosen = models or common
    missing = sorted(set(chosen) - set(common))
    if missing:
        raise SystemExit(f"--models {missing} are not scored by every run; they have: {common}")
    metrics = (f"recall@{k}", f"ndcg@{k}")
    values = {
        (m, metric): [per_user(r["per_user"]["rank_of_target"][m], metric) for r in runs]
        for m in chosen
        for metric in metrics
    }
    table = {}
    for m in chosen:
        table[m] = {}
        for metric in metrics:
            found = bootstrap_interval(values[(m, metric)], resamples=resamples)
            table[m][metric] = [found["difference"], found["low"], found["high"]]
    pairs = [("grown", "retrained (full catalogue)")] + [
        (m, "grown") for m in chosen if m.startswith("grown + ")
    ]
    pairs += [(m, c) for c in against or [] for m in chosen if m != c and m.startswith("grown + ")]
    differences = {}
    missing = sorted({c for c in against or []} - set(chosen))
    if missing:
        raise SystemExit(f"--against {missing} are not among the pooled models: {chosen}")
    for a, b in pairs:
        if a in chosen and b in chosen:
            label = f"{a.removeprefix('grown + ')} - {b.replace('retrained (full catalogue)', 'retrained')}"
            differences[label] = {}
            for metric in metrics:
                paired = [x - y for x, y in zip(values[(a, metric)], values[(b, metric)], strict=True)]
                found = bootstrap_interval(paired, resamples=resamples)
                differences[label][metric] = [found["difference"], found["low"], found["high"]]
    everyone = {
        label: all_users(runs, a, b, k, resamples)
        for label, (a, b) in [(m, (m, None)) for m in chosen] + list(differences_pairs(pairs, chosen))
        if all(m in r["per_user"].get("old_item_rank_of_target", {}) for r in runs for m in (a, b) if m)
    }
    return {
        "seeds": [r["budget"]["seed"] for r in runs],
        "all_users_recall": everyone,
        "resamples": resamples,
        "users": len(runs[0]["per_user"]["users"]),
        "dataset": runs[0]["dataset"],
        "models": table,
        "paired_differences": differences,
    }


def differences_pairs(pairs: list[tuple[str, str]], chosen: list[str]):
    """``(label, (a, b))`` of the paired rows whose two models are both pooled."""
    for a, b in pairs:
        if a in chosen and b in chosen:
            yield (
                f"{a.removeprefix('grown + ')} - {b.replace('retrained (full catalogue)', 'retrained')}",
                (a, b),
            )


def all_users(runs: list[dict], a: str, b: str | None, k: int, resamples: int) -> list[float]:
    """Recall@``k`` of ``a`` (minus ``b``'s, paired) over all users as the population holds them: each seed's
    new-item and old-item users weighted by their shares (``all_users.new_item_user_share``), averaged over
    seeds; a stratified bootstrap resamples each group's users within each seed."""
    rng = np.random.default_rng(0)
    means, draws = [], np.zeros(resamples)
    for run in runs:
        weight = run["all_users"]["new_item_user_share"]
        groups = []
        for key, share in (("rank_of_target", weight), ("old_item_rank_of_target", 1 - weight)):
            ranks = run["per_user"][key]
            values = per_user(ranks[a], f"recall@{k}") - (
                0 if b is None else per_user(ranks[b], f"recall@{k}")
            )
            groups.append((values, share))
        means.append(sum(share * v.mean() for v, share in groups))
        draws += sum(share * v[rng.integers(0, len(v), (resamples, len(v)))].mean(1) for v, share in groups)
    draws /= len(runs)
    return [float(np.mean(means)), float(np.percentile(draws, 2.5)), float(np.percentile(draws, 97.5))]


def markdown(pooled: dict, k: int) -> str:
    cell = "{:.4f} [{:.4f}, {:.4f}]"
    seeds = ", ".join(map(str, pooled["seeds"]))
    lines = [
        f"## New items on {pooled['dataset']}: seeds {seeds} pooled, {pooled['users']} new-item users each",
        "",
        f"| model | Recall@{k} [95% CI] | NDCG@{k} [95% CI] |",
        "|---|---|---|",
    ]
    for model, row in pooled["models"].items():
        lines.append(f"| {model} | {cell.format(*row[f'recall@{k}'])} | {cell.format(*row[f'ndcg@{k}'])} |")
    lines += ["", f"| paired difference | Recall@{k} [95% CI] | NDCG@{k} [95% CI] |", "|---|---|---|"]
    signed = "{:+.4f} [{:+.4f}, {:+.4f}]"
    for label, row in pooled["paired_differences"].items():
        lines.append(
            f"| {label} | {signed.format(*row[f'recall@{k}'])} | {signed.format(*row[f'ndcg@{k}'])} |"
        )
    lines += ["", f"| all users, as the population holds them | Recall@{k} [95% CI] |", "|---|---|"]
    for label, row in pooled["all_users_recall"].items():
        lines.append(f"| {label} | {(signed if ' - ' in label else cell).format(*row)} |")
    lines += [
        "",
        "Means over seeds; intervals: stratified percentile bootstrap (users resampled within each seed, "
        f"{pooled['resamples']:,} resamples), paired rows pair each user within each seed.",
    ]
    return "\n".join(lines) + "\n"


@dataclass
class Settings:
    runs: list[str] = field(
        default_factory=list,
        metadata={"help": "output folders of bench_grow_protocol.py, one per seed (also positional)"},
    )
    models: list[str] | None = field(
        default=None, metadata={"help": "models to pool (None: all common ones)"}
    )
    against: list[str] | None = field(
        default=None, metadata={"help": "also pair every 'grown + ...' model with these (e.g. the controls)"}
    )
    k: int = field(default=10, metadata={"help": "the cut-off K of Recall@K and NDCG@K"})
    resamples: int = field(default=10_000, metadata={"help": "bootstrap resamples"})
    out: str | None = field(
        default=None, metadata={"help": "write the markdown here (and its .json beside it)"}
    )

    def __post_init__(self) -> None:
        if len(self.runs) < 2:
            raise SystemExit("give two or more runs (one per training seed)")


def main(argv=None) -> None:
    args = parse(
        Settings, argv, prog="pool_grow_protocol.py", description=__doc__, positionals=(("runs", "*"),)
    )
    pooled = pool(load_runs(args.runs), args.models, args.k, args.resamples, args.against)
    text = markdown(pooled, args.k)
    print(text)
    if args.out:
        out = Path(args.out)
        atomic_write_text(out, text)
        atomic_write_text(out.with_suffix(".json"), json.dumps(pooled, indent=1))


if __name__ == "__main__":
    main()
