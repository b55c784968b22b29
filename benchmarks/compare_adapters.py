"""Compare trained adapters on the same test users: metrics, likelihoods and paired bootstrap intervals.

    python benchmarks/compare_adapters.py --sid-index SIDS --out runs/compare \\
        --adapter mean=runs/ml100k/mean/adapter --adapter centroid=runs/ml100k/centroid/adapter \\
        [--adapter name=DIR ...] [--reference mean] [--users N] [--seeds 0]

Each adapter (from ``peft-grounded sft``, or a runner's ``sft/adapter``) is evaluated with the prompt
format it records, on every test user (or a seeded sample of ``--users``) with the SID-constrained beam
search, in one pass that also scores the targets' likelihood; its results go to ``<out>/<name>.json``
and are read back on a rerun. The most-popular ranking is scored on the same users. The script prints
(and writes to ``<out>/results.md`` / ``results.json``) a table of Recall/NDCG@K and the constrained NLL,
and the paired 95% intervals of every adapter against ``--reference`` and against popularity.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from peft_grounded import runs
from peft_grounded.evaluation import (
    POPULARITY_LABEL,
    EvalSettings,
    compare_users,
    evaluate_adapter,
    intervals_table,
    popularity_users,
    rank_metrics,
)
from peft_grounded.sids import SIDIndex, load_catalogue

METRICS = ("recall@5", "recall@10", "recall@20", "ndcg@10", "constrained_nll")


def _named(pairs: list[str]) -> dict[str, Path]:
    named = {}
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep or not name or not path:
            raise SystemExit(f"--adapter {pair!r}: write NAME=DIRECTORY (e.g. centroid=runs/x/adapter)")
        if name in named:
            raise SystemExit(f"--adapter: the name {name!r} is given twice")
        named[name] = Path(path)
    return named


def _row(name: str, records: list[dict]) -> str:
    scores = rank_metrics([r["rank"] for r in records], (5, 10, 20))
    scores["constrained_nll"] = sum(r["constrained_nll"] for r in records) / len(records)
    return f"| {name} | {len(records)} | " + " | ".join(f"{scores[m]:.4f}" for m in METRICS) + " |"


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
    parser.add_argument("--fp32", action="store_true", help="fp32 base and decoding (default: bf16)")
    parser.add_argument("--resamples", type=int, default=10_000)
    args = parser.parse_args()

    adapters = _named(args.adapter)
    catalogue, index = load_catalogue(args.catalogue), SIDIndex.load(args.sid_index)
    settings = EvalSettings(
        ks=(5, 10, 20),
        users=args.users,
        seed=args.seed,
        num_beams=args.num_beams,
        batch_size=args.batch_size,
        bf16=not args.fp32,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    users: dict[str, list[dict]] = {}
    seconds: dict[str, float] = {}
    for name, path in adapters.items():
        stored = args.out / f"{name}.json"
        if stored.is_file():
            saved = json.loads(stored.read_text())
            users[name], seconds[name] = saved["users"]["test"], saved["seconds"]
            continue
        print(f"[compare] evaluating {name} ({path})", flush=True)
        started = time.perf_counter()
        evaluation = evaluate_adapter(str(path), index, catalogue, settings, parts=("test",))
        seconds[name] = time.perf_counter() - started
        runs.write_json_atomic(
            stored, evaluation.to_dict() | {"seconds": seconds[name], "adapter": str(path)}
        )
        users[name] = evaluation.users["test"]
    split = catalogue.leave_one_out()
    popularity = popularity_users(split, ("test",), settings, items=index.item_ids)["test"]
    ranked = {name: [r for r in records if r.get("all", True)] for name, records in users.items()}
    table = [
        "| model | users | " + " | ".join(METRICS) + " |",
        "|---|---:|" + "---:|" * len(METRICS),
        *(_row(name, records) for name, records in ranked.items()),
        _row(POPULARITY_LABEL, [r for r in popularity if r.get("all", True)]),
    ]
    references = {POPULARITY_LABEL: [popularity]}
    if args.reference in users:
        references = {f"{args.reference} init": [users[args.reference]]} | references
    named = {(f"{args.reference} init" if n == args.reference else n): [v] for n, v in users.items()}
    rows = compare_users(named, references, METRICS, "all", resamples=args.resamples)
    timing = ", ".join(f"{n} {s:.0f} s" for n, s in seconds.items())
    text = "\n".join(
        [
            f"## {catalogue.name}: {len(ranked[next(iter(ranked))])} test users, {args.num_beams} beams "
            f"({'fp32' if args.fp32 else 'bf16'}); evaluation time: {timing}",
            "",
            *table,
            "",
            f"Paired bootstrap 95% intervals ({args.resamples:,} resamples; NLL: lower is better):",
            "",
            intervals_table(rows),
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
