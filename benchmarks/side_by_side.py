"""Peers and grounded-LLM strategies side by side on one split, one sample of users, one table.

    OMP_NUM_THREADS=1 python benchmarks/side_by_side.py --dataset movielens-100k --out runs/sbs-ml100k
    OMP_NUM_THREADS=1 python benchmarks/side_by_side.py --dataset ../shared/data/amazon-office --out runs/sbs-office
    python benchmarks/side_by_side.py --out runs/sbs-smoke --smoke        # a path check, seconds of training

Builds the SIDs (MiniLM, 3 x 64 + disambiguation; cached in ``<out>/sids``), scores the peers
(popularity, text KNN on the index's item vectors, SASRec) and trains each ``--strategies`` LLM row through
the experiment runner for ``--minutes`` of SFT (the sequence objective, LoRA r 8 on all linear layers + the
new rows, lr 1e-3, batch 8; bf16 only on a CPU with native bf16), then prints and writes
``<out>/side_by_side.md`` / ``.json``: Recall@10 on all test users and on cold-target users, mean [95% CI],
paired differences against ``--reference``, training minutes and threads per row; with several LLM rows,
their target NLL; with ``--eval-every N``, learning curves (SASRec's epochs and the LLM's validation points
against training minutes). Everything resumes; ``--report-only`` rebuilds the tables from finished runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from peft_grounded import assets
from peft_grounded._scripts import parse_script_args
from peft_grounded.evaluation import EvalSettings
from peft_grounded.pipeline import Budget, Experiment, run_strategy
from peft_grounded.pipeline.side_by_side import (
    PEER_LABELS,
    PEERS,
    curve_table,
    peer_curve,
    run_peers,
    side_by_side_table,
    strategy_curve,
    strategy_row,
    summarise_rows,
)
from peft_grounded.precision import script_precision
from peft_grounded.prompts import PromptFormat
from peft_grounded.sids import SIDIndex, build_sids, load_catalogue
from peft_grounded.sids.index import JSON_NAME
from peft_grounded.training.runs import write_json_atomic


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="movielens-100k")
    p.add_argument("--out", required=True)
    p.add_argument("--strategies", nargs="*", default=["centroid", "peft_default"])
    p.add_argument("--peers", nargs="*", default=list(PEERS), choices=PEERS)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument(
        "--minutes",
        type=float,
        default=12.0,
        help="SFT minutes per LLM row (0: --sft-steps alone, cosine schedule)",
    )
    p.add_argument("--grounding-minutes", type=float, default=2.0)
    p.add_argument("--sasrec-minutes", type=float, default=5.0, help="SASRec's time budget (best epoch kept)")
    p.add_argument("--users", type=int, default=0, help="test users scored (0: all)")
    p.add_argument("--reference", default="sasrec", help="row the paired differences are taken against")
    p.add_argument("--fp32", action="store_true", help="float32 even on a CPU with native bf16")
    p.add_argument("--bf16", action="store_true", help="bf16 even where the CPU emulates it (slow)")
    p.add_argument("--layers", type=int, default=0, help="keep the base's first N decoder blocks (0: all)")
    p.add_argument("--keep-history", action="store_true", help="let the LLM rows recommend history items")
    p.add_argument("--sft-steps", type=int, default=0, help="step cap on SFT (0: the time alone)")
    p.add_argument(
        "--eval-every",
        type=int,
        default=0,
        help="validation Recall@10 of the LLM rows every N SFT steps, for the learning curve (0: off)",
    )
    p.add_argument("--curve-users", type=int, default=100, help="validation users of those points")
    p.add_argument(
        "--also", nargs="*", default=[], help="more ranking metrics, one table each (recall@5 ...)"
    )
    p.add_argument(
        "--report-only",
        action="store_true",
        help="tables from the LLM runs already finished in --out, whatever their settings (nothing trains)",
    )
    p.add_argument("--smoke", action="store_true")
    return parse_script_args(p, argv)


def finished_record(folder: Path, name: str) -> dict:
    """The runner's results of a finished run of strategy ``name`` in ``folder`` (for ``--report-only``)."""
    path = folder / "metrics.json"
    record = json.loads(path.read_text()) if path.is_file() else None
    if not isinstance(record, dict) or record.get("strategy") != name or "users" not in record:
        raise SystemExit(f"{path}: no finished run of strategy {name!r} (run without --report-only first)")
    return record


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    catalogue = load_catalogue(args.dataset)
    codes = 8 if args.smoke else 64
    if (out / "sids" / JSON_NAME).is_file():
        index = SIDIndex.load(out / "sids")
    else:
        index = build_sids(catalogue, out / "sids", levels=3, codes=codes, show_progress=False)
    precision = script_precision(args.fp32, args.bf16)
    bf16 = precision.bf16
    users = (8 if args.smoke else None) if not args.users else args.users
    budget = Budget.from_training(
        dict(
            per_device_train_batch_size=8,
            max_length=128,
            bf16=bf16,
            save_steps=200,
            logging_steps=10,
            disable_tqdm=True,
        ),
        grounding=dict(
            max_steps=2 if args.smoke else 0,
            learning_rate=1e-3,
            max_minutes=None if args.smoke else args.grounding_minutes,
        ),
        sft=dict(
            max_steps=4 if args.smoke else args.sft_steps,
            learning_rate=1e-3,
            max_minutes=None if args.smoke or not args.minutes else args.minutes,
        ),
        lora=dict(r=8, lora_alpha=16),
        evaluation=EvalSettings(
            users=users, num_beams=20, ks=(5, 10, 20), bf16=bf16, exclude_history=not args.keep_history
        ),
        weights_dtype="bfloat16" if bf16 else "float32",
        eval_parts=("test",),
        max_train_examples=64 if args.smoke else None,
        max_grounding_examples=64 if args.smoke else 4000,
        eval_every=args.eval_every,
        curve_users=args.curve_users,
    )
    fmt = PromptFormat(objective="sequence", max_history=19)
    model_path = str(assets.smollm2())
    if args.layers:
        from peft_grounded.recommend.shallow_base import shallow_base

        model_path = str(shallow_base(model_path, args.layers, out / f"base-{args.layers}-blocks"))
    experiment = Experiment(model_path, catalogue, index, fmt=fmt)
    print(
        f"{catalogue.name}: {len(catalogue)} items, {len(experiment.split)} users; precision "
        f"{'bf16' if bf16 else 'fp32'}",
        flush=True,
    )
    rows: dict[str, dict] = {}
    settings = {seed: budget.with_seed(seed).eval_settings() for seed in args.seeds}
    sasrec = None
    if "sasrec" in args.peers:
        from peft_grounded.peers.sasrec import SASRecConfig

        sasrec = SASRecConfig(max_minutes=0.2 if args.smoke else args.sasrec_minutes)
    peers: dict[str, list] = {}
    curves: dict[
        str, list
    ] = {}  # (training minutes, validation Recall@10): SASRec's epochs, the LLM's points
    for seed in args.seeds:
        found = run_peers(
            catalogue,
            index,
            experiment.split,
            settings[seed],
            out / "peers" / f"seed{seed}",
            args.peers,
            sasrec=None if sasrec is None else replace(sasrec, seed=seed),  # one SASRec per seed
        )
        for name, row in found.items():
            peers.setdefault(name, []).append(row)
    for name, seeds in peers.items():
        rows[name] = {
            "label": seeds[0]["label"],
            "records": [r["records"] for r in seeds],
            "minutes": seeds[0]["minutes"],
            "threads": seeds[0]["threads"],
        }
        curves[seeds[0]["label"]] = peer_curve(seeds[0])
    for name in args.strategies:
        records = []
        for seed in args.seeds:
            folder = out / "strategies" / f"{name}-seed{seed}"
            if args.report_only:
                records.append(finished_record(folder, name))
                continue
            print(f"[side-by-side] {name} seed {seed}", flush=True)
            records.append(run_strategy(name, experiment, budget.with_seed(seed), folder, resume=True))
        rows[name] = strategy_row(name, records)
        curves[rows[name]["label"]] = strategy_curve(records[0])
    reference = args.reference if args.reference in rows else next(iter(rows))
    subsets = ("all", "warm", "cold")
    cold = experiment.split.cold_items(budget.evaluation.cold_max_count)
    summaries = summarise_rows(rows, reference, subsets=subsets, cold_items=cold)
    table = side_by_side_table(summaries, reference, subsets=subsets)
    for metric in args.also:
        table += f"\n## {metric}\n\n" + side_by_side_table(
            summarise_rows(rows, reference, metric, subsets=subsets, cold_items=cold),
            reference,
            metric,
            subsets=subsets,
        )
    header = (
        f"# Side by side: {catalogue.name}\n\nCommand: `python benchmarks/side_by_side.py "
        f"{' '.join(sys.argv[1:] if argv is None else argv)}`; precision {'bf16' if bf16 else 'fp32'}; "
        f"LLM rows: {args.minutes:g} min SFT each (grounding strategies +{args.grounding_minutes:g}).\n\n"
    )
    llm = {name: rows[name] for name in args.strategies}
    if len(llm) > 1:  # the target's likelihood: finer than Recall where few users are hit
        nll_reference = args.reference if args.reference in llm else args.strategies[0]
        nll = summarise_rows(llm, nll_reference, "constrained_nll", subsets=subsets, cold_items=cold)
        table += (
            "\n## Target NLL of the LLM rows (nats, over the catalogue's SIDs; lower is better)\n\n"
            + side_by_side_table(nll, nll_reference, "constrained NLL", subsets=subsets)
        )
    curves = {name: points for name, points in curves.items() if points}
    if curves:
        table += (
            "\n## Learning curves (validation Recall@10 within each budget of training minutes, seed "
            f"{args.seeds[0]})\n\n"
            + curve_table(curves, best_so_far=[PEER_LABELS["sasrec"]])
            + "\nSASRec: after each epoch, all validation users, its best epoch so far (the one it keeps)."
            + (
                f" LLM rows: every {args.eval_every} steps inside one run (learning rate not yet annealed), "
                f"{args.curve_users} seeded validation users."
                if args.eval_every
                else ""
            )
            + "\n"
        )
    (out / "side_by_side.md").write_text(header + table)
    write_json_atomic(out / "side_by_side.json", {"summaries": summaries, "reference": reference})
    print(header + table, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
