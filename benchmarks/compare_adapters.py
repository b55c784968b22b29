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

import argparse
import json
import time
from pathlib import Path

from peft_grounded._scripts import parse_script_args
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
from peft_grounded.sids import SIDIndex, load_catalogue
from peft_grounded.training import runs

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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sid-index", required=True)
    parser.add_argument("--catalogue", default="movielens-100k")
    parser.add_argument("--adapter", action="append", required=True, help="NAME=DIRECTORY (repeat)")
    parser.add_argument("--reference", default="mean", help="the adapter name the others are compared with")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--users", type=int, default=None, help="a seeded sample of test users (default: all)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the user sample")
    parser.add_argument("--num-beams", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument(
        "--fp32", action="store_true", help="fp32 base and decoding (default: the machine's choice)"
    )
    parser.add_argument(
        "--bf16", action="store_true", help="bf16 base and decoding even where bf16 is emulated"
    )
    parser.add_argument("--resamples", type=int, default=10_000)
    parser.add_argument(
        "--subsets", nargs="+", default=["all", "cold"], help="user subsets (cold: a rarely seen target)"
    )
    parser.add_argument(
        "--pair", action="append", default=[], help="A:B, compare adapter A with adapter B too (repeat)"
    )
    args = parse_script_args(parser)
    bf16 = script_precision(args.fp32, args.bf16).bf16

    adapters = _named(args.adapter)
    catalogue, index = load_catalogue(args.catalogue), SIDIndex.load(args.sid_index)
    settings = EvalSettings(
        ks=(5, 10, 20),
        users=args.users,
        seed=args.seed,
        num_beams=args.num_beams,
        batch_size=args.batch_size,
        bf16=bf16,
    )
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
            f"## {catalogue.name}: {len(_in(popularity, 'all'))} test users, {args.num_beams} beams "
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
        {"intervals": rows, "seconds": seconds, "args": vars(args) | {"out": str(args.out)}},
    )
    print(text)


if __name__ == "__main__":
    main()
