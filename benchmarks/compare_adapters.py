"""Compare trained adapters on the same test users: metrics, likelihoods and paired bootstrap intervals.

    python benchmarks/compare_adapters.py --sid-index SIDS --out runs/compare \\
        --adapter mean=runs/ml100k/mean/adapter --adapter centroid=runs/ml100k/centroid/adapter \\
        [--adapter name@SEED=DIR ...] [--reference mean] [--users N] [--seed 0]

Each adapter (from ``peft-grounded sft``, or a runner's ``sft/adapter``) is evaluated with the prompt
format it records, on every test user (or a seeded sample of ``--users``) with the SID-constrained beam
search, in one pass that also scores the targets' likelihood; its results go to ``<out>/<name>.json``
and are read back on a rerun. The most-popular ranking is scored on the same users. The script prints
(and writes to ``<out>/results.md`` / ``results.json``) a table of Recall/NDCG@K and the constrained NLL,
and the paired 95% intervals of every adapter against ``--reference`` and against popularity.

Several training seeds of one strategy: name each run ``NAME@SEED`` (``centroid@1=runs/s1/centroid/adapter``;
a bare ``NAME`` is seed 0). The table then shows each strategy's mean over its seeds, and the intervals are
pooled over the seeds a strategy shares with the reference, pairing each user within each seed.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from peft_grounded.cli.common import DataArguments, load_data
from peft_grounded.evaluation import (
    POPULARITY_LABEL,
    EvalSettings,
    compare_users,
    evaluate_adapter,
    intervals_table,
    popularity_users,
    rank_metrics,
)
from peft_grounded.precision import script_precision
from peft_grounded.training import runs

try:
    from benchmarks._args import REPEATABLE, package_fields, parse
except ModuleNotFoundError:  # run as a file: its folder is on sys.path, not the repository
    from _args import REPEATABLE, package_fields, parse

METRICS = ("recall@5", "recall@10", "recall@20", "ndcg@10", "constrained_nll")


def _named(pairs: list[str]) -> dict[tuple[str, int], Path]:
    """``(strategy, seed) -> adapter directory`` from ``NAME[@SEED]=DIRECTORY`` arguments."""
    named: dict[tuple[str, int], Path] = {}
    for pair in pairs:
        label, sep, path = pair.partition("=")
        name, at, seed = label.partition("@")
        if not sep or not name or not path or (at and not seed.isdigit()):
            raise SystemExit(
                f"--adapter {pair!r}: write NAME=DIRECTORY or NAME@SEED=DIRECTORY "
                "(e.g. centroid@1=runs/s1/centroid/adapter)"
            )
        key = (name, int(seed) if at else 0)
        if key in named:
            raise SystemExit(f"--adapter: {name!r} seed {key[1]} is given twice")
        named[key] = Path(path)
    return named


def _label(name: str, seed: int) -> str:
    return name if seed == 0 else f"{name}@{seed}"


def _means(seeds: list[list[dict]]) -> dict[str, float]:
    """Mean over seeds of each metric (every seed scored on the same users)."""
    per_seed = []
    for records in seeds:
        scores = rank_metrics([r["rank"] for r in records], (5, 10, 20))
        scores["constrained_nll"] = sum(r["constrained_nll"] for r in records) / len(records)
        per_seed.append(scores)
    return {m: sum(s[m] for s in per_seed) / len(per_seed) for m in METRICS}


def _row(name: str, subset: str, seeds: list[list[dict]]) -> str:
    mean = _means(seeds)
    cells = " | ".join(f"{mean[m]:.4f}" for m in METRICS)
    return f"| {name} | {subset} | {len(seeds)} | {len(seeds[0])} | {cells} |"


def _in(records: list[dict], subset: str) -> list[dict]:
    return [r for r in records if r.get(subset, subset == "all")]


@dataclass
class Settings:
    """The adapters compared and the table's settings; the SID index and catalogue: the package's
    ``DataArguments`` fields (:data:`DataFields`); how the users are evaluated: EvalSettings' fields."""

    out: Path = field(metadata={"help": "results (one JSON per adapter, read back on a rerun) and the table"})
    adapter: list[str] = field(
        metadata={"help": "NAME=DIRECTORY or NAME@SEED=DIRECTORY; repeatable"} | REPEATABLE
    )
    reference: str = field(default="mean", metadata={"help": "the adapter name the others are compared with"})
    fp32: bool = field(
        default=False,
        metadata={"help": "fp32 base and decoding (neither --fp32 nor --bf16: the machine's choice)"},
    )
    resamples: int = field(default=10_000, metadata={"help": "bootstrap resamples"})
    subsets: list[str] = field(
        default_factory=lambda: ["all", "cold"],
        metadata={"help": "user subsets (cold: a rarely seen target)"},
    )
    pair: list[str] = field(
        default_factory=list,
        metadata={"help": "A:B, compare adapter A with adapter B too; repeatable"} | REPEATABLE,
    )

    def __post_init__(self) -> None:
        self.adapters = _named(self.adapter)


# --sid_index (the index the adapters were trained on) and --catalogue (None: the one the index records), as the
# package's commands declare them
DataFields = package_fields(DataArguments, "sid_index", "catalogue")


def check(args: Settings, data: DataFields, settings: EvalSettings) -> None:
    if not {5, 10, 20} <= set(settings.ks):
        raise SystemExit(f"--ks must hold 5, 10 and 20 (the table's columns), got {settings.ks}")


def parse_args(argv=None) -> tuple:
    """The settings, the SID index and catalogue, and the evaluation settings (``args, data, settings``)."""
    return parse(
        (Settings, DataFields, EvalSettings),
        argv,
        prog="compare_adapters.py",
        description=__doc__,
        check=check,
        defaults={"ks": [5, 10, 20]},
    )


def main(argv=None) -> None:
    args, data, settings = parse_args(argv)
    # --bf16 (EvalSettings.bf16) and --fp32 force one; neither: the machine's choice
    bf16 = script_precision(args.fp32, settings.bf16).bf16
    settings = replace(settings, bf16=bf16)
    adapters = args.adapters
    catalogue, index = load_data(data.catalogue, data.sid_index)
    args.out.mkdir(parents=True, exist_ok=True)
    users: dict[str, dict[int, list[dict]]] = {}
    seconds: dict[str, float] = {}
    for (name, seed), path in adapters.items():
        label = _label(name, seed)
        stored = args.out / f"{label}.json"
        if stored.is_file():
            saved = json.loads(stored.read_text())
            users.setdefault(name, {})[seed], seconds[label] = saved["users"]["test"], saved["seconds"]
            continue
        print(f"[compare] evaluating {label} ({path})", flush=True)
        started = time.perf_counter()
        evaluation = evaluate_adapter(str(path), index, catalogue, settings, parts=("test",))
        seconds[label] = time.perf_counter() - started
        runs.write_json_atomic(
            stored, evaluation.to_dict() | {"seconds": seconds[label], "adapter": str(path)}
        )
        users.setdefault(name, {})[seed] = evaluation.users["test"]
    split = catalogue.leave_one_out()
    popularity = popularity_users(split, ("test",), settings, items=index.item_ids)["test"]
    pairs = [tuple(p.split(":", 1)) for p in args.pair]
    for a, b in pairs:
        if a not in users or b not in users:
            raise SystemExit(f"--pair {a}:{b}: both must be --adapter names (have: {', '.join(users)})")
    table = [
        "| model | subset | seeds | users | " + " | ".join(METRICS) + " |",
        "|---|---|---:|---:|" + "---:|" * len(METRICS),
    ]
    rows, relative = [], []
    for subset in args.subsets:
        if not _in(popularity, subset):
            print(f"[compare] no test user in the subset {subset!r}: skipped")
            continue
        for name, by_seed in users.items():
            table.append(_row(name, subset, [_in(by_seed[s], subset) for s in sorted(by_seed)]))
        table.append(_row(POPULARITY_LABEL, subset, [_in(popularity, subset)]))
        for name, by_seed in users.items():
            seeds = sorted(by_seed)
            references = {POPULARITY_LABEL: {s: popularity for s in seeds}}
            if args.reference in users and name != args.reference:
                references = {f"{args.reference} init": users[args.reference]} | references
            references |= {b: users[b] for a, b in pairs if a == name}
            for reference, ref_by_seed in references.items():
                common = [s for s in seeds if s in ref_by_seed]
                if not common:
                    print(f"[compare] {name} has no seed in common with {reference}: not compared")
                    continue
                found = compare_users(
                    {name: [by_seed[s] for s in common]},
                    {reference: [ref_by_seed[s] for s in common]},
                    METRICS,
                    subset,
                    resamples=args.resamples,
                )
                rows += found
                if reference == POPULARITY_LABEL:
                    continue
                base = _means([_in(ref_by_seed[s], subset) for s in common])
                for r in found:
                    if r["metric"] != "constrained_nll" and base[r["metric"]] > 0:
                        relative.append(
                            f"| {name} | {reference} | {r['metric']} | {subset} | {r['seeds']} | "
                            f"{r['difference'] / base[r['metric']]:+.0%} | "
                            f"[{r['low'] / base[r['metric']]:+.0%}, {r['high'] / base[r['metric']]:+.0%}] |"
                        )
    timing = ", ".join(f"{n} {s:.0f} s" for n, s in seconds.items())
    text = "\n".join(
        [
            f"## {catalogue.name}: {len(_in(popularity, 'all'))} test users, {settings.num_beams} beams "
            f"({'bf16' if bf16 else 'fp32'}); evaluation time: {timing}",
            "",
            *table,
            "",
            f"Paired bootstrap 95% intervals ({args.resamples:,} resamples; NLL: lower is better):",
            "",
            intervals_table(rows),
            "Relative differences (the difference and its interval over the reference's mean, as the papers "
            "report them):",
            "",
            "| strategy | vs | metric | subset | seeds | relative | 95% interval |",
            "|---|---|---|---|---:|---:|---|",
            *relative,
        ]
    )
    (args.out / "results.md").write_text(text + "\n")
    runs.write_json_atomic(
        args.out / "results.json",
        {
            "intervals": rows,
            "seconds": seconds,
            "args": asdict(args) | asdict(data) | {"out": str(args.out)} | asdict(settings),
        },
    )
    print(text)


if __name__ == "__main__":
    main()
