"""Peers and grounded-LLM strategies side by side on one split, one sample of users, one table.

    OMP_NUM_THREADS=1 python benchmarks/bench_side_by_side.py --dataset movielens-100k --out runs/sbs-ml100k
    OMP_NUM_THREADS=1 python benchmarks/bench_side_by_side.py --dataset ../shared/data/amazon-office --out runs/sbs-office
    python benchmarks/bench_side_by_side.py --out runs/sbs-smoke --smoke        # a path check, seconds of training
    # the peers alone on every test user, SASRec trained to its patience (cached), TGH beside it:
    OMP_NUM_THREADS=1 python benchmarks/bench_side_by_side.py --dataset movielens-100k --out runs/tgh-ml100k \
        --strategies --peers popularity knn_last sasrec tgh --sasrec-minutes 0

Builds the SIDs (MiniLM, 3 x 64 + disambiguation; cached in ``<out>/sids``), scores the peers
(popularity, text KNN on the index's item vectors, SASRec, TGH: the transition-graph heuristic, its settings
chosen on the validation users) and trains each ``--strategies`` LLM row through the experiment runner for
``--minutes`` of SFT (the sequence objective, LoRA r 8 on all linear layers + the new rows, lr 1e-3, batch 8;
bf16 only on a CPU with native bf16), then prints and writes
``<out>/side_by_side.md`` / ``.json``: Recall@10 on all test users and on cold-target users, mean [95% CI],
paired differences against ``--reference``, training minutes and threads per row; with several LLM rows,
their target NLL; with ``--eval-every N``, learning curves (SASRec's epochs and the LLM's validation points
against training minutes). Everything resumes; ``--report-only`` rebuilds the tables from finished runs.
A setting the package declares is parsed from its declaration under its flag: of ``DemoArguments``
``--strategies`` (here none given: the peers alone) and ``--seeds``, of the demo's ``Preset`` ``--peers`` (none
given: no peers), of ``LoraModelConfig`` ``--layers``, of the runner's ``Budget`` ``--eval_every`` and
``--curve_users``; this table's defaults of those in :data:`DEFAULTS`.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from peft_grounded import assets
from peft_grounded.cli.demo import DemoArguments
from peft_grounded.cli.model_config import LoraModelConfig
from peft_grounded.evaluation import EvalSettings
from peft_grounded.pipeline import Budget, Experiment, run_strategy
from peft_grounded.pipeline.demo import Preset
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
from peft_grounded.prompts import PromptFormat
from peft_grounded.sids import SIDIndex, build_sids, load_catalogue
from peft_grounded.sids.index import JSON_NAME
from peft_grounded.training.runs import write_json_atomic

try:
    from benchmarks._args import Precision, ZeroOrMore, field_default, package_fields, parse
except ModuleNotFoundError:  # run as a file: its folder is on sys.path, not the repository
    from _args import Precision, ZeroOrMore, field_default, package_fields, parse


@dataclass(kw_only=True)
class Settings(Precision):
    """The split, the rows and their budgets (``--fp32`` / ``--bf16``: the LLM rows' precision; neither: bf16
    only on a CPU with native bf16)."""

    out: str = field(metadata={"help": "the SIDs, the runs and the tables go here (resumed)"})
    dataset: str = field(default="movielens-100k", metadata={"help": "the catalogue (a name or a folder)"})
    minutes: float = field(
        default=12.0, metadata={"help": "SFT minutes per LLM row (0: --sft-steps alone, cosine schedule)"}
    )
    grounding_minutes: float = field(
        default=2.0, metadata={"help": "grounding minutes of a grounding strategy"}
    )
    sasrec_minutes: float = field(
        default=5.0,
        metadata={
            "help": "SASRec's time budget (best epoch kept; 0: none, trained to its patience and cached, "
            "sids.sasrec_cache.shared_fit)"
        },
    )
    users: int = field(default=0, metadata={"help": "test users scored (0: all)"})
    reference: str = field(
        default="sasrec", metadata={"help": "row the paired differences are taken against"}
    )
    keep_history: bool = field(default=False, metadata={"help": "let the LLM rows recommend history items"})
    sft_steps: int = field(default=0, metadata={"help": "step cap on SFT (0: the time alone)"})
    also: list[str] = field(
        default_factory=list,
        metadata={"help": "more ranking metrics, one table each (recall@5 ...)", "action": ZeroOrMore},
    )
    report_only: bool = field(
        default=False,
        metadata={
            "help": "tables from the LLM runs already finished in --out, whatever their settings (nothing trains)"
        },
    )
    smoke: bool = field(default=False, metadata={"help": "a path check: seconds of training, a few users"})


# the fields of the package's settings dataclasses this table sets, as the package declares them
DemoFields = package_fields(
    DemoArguments, "strategies", "seeds", parser={"strategies": {"action": ZeroOrMore}}
)
PeerFields = package_fields(Preset, "peers", parser={"peers": {"action": ZeroOrMore, "choices": PEERS}})
ModelFields = package_fields(LoraModelConfig, "layers")
CurveFields = package_fields(Budget, "eval_every", "curve_users")
PARTS = (DemoFields, PeerFields, ModelFields, CurveFields)
DEFAULTS = {  # this table's defaults of the package's fields (the flags given win)
    "strategies": ["centroid", "peft_default"],  # the LLM rows: none given, the peers alone
    "seeds": list(field_default(Preset, "seeds")),  # the demo's
    "peers": list(PEERS),  # every peer pipeline.side_by_side scores, TGH included
}


def parse_args(argv=None) -> Settings:
    """The settings, the package's parsed beside them (:data:`PARTS`) set on them as attributes of the same
    names (``args.strategies``, ``args.peers``, ``args.seeds``, ``args.layers``, ``args.eval_every``,
    ``args.curve_users``)."""
    args, *parts = parse(
        (Settings, *PARTS), argv, prog="bench_side_by_side.py", description=__doc__, defaults=DEFAULTS
    )
    for part in parts:
        for name, value in vars(part).items():
            setattr(args, name, value)
    return args


def finished_record(folder: Path, name: str) -> dict:
    """The runner's results of a finished run of strategy ``name`` in ``folder`` (for ``--report-only``)."""
    path = folder / "metrics.json"
    record = json.loads(path.read_text()) if path.is_file() else None
    if not isinstance(record, dict) or record.get("strategy") != name or "users" not in record:
        raise SystemExit(f"{path}: no finished run of strategy {name!r} (run without --report-only first)")
    return record


def tgh_choice(row: dict) -> str:
    """Markdown: TGH's settings as chosen on the validation users, and the table they were chosen from."""
    chosen = row["chosen"]
    lines = [
        "",
        f"## TGH's settings, chosen on the validation users: count_bonus {chosen['count_bonus']:g}, "
        f"max_ring {chosen['max_ring']}",
        "",
        "| count_bonus | max_ring | valid R@10 | valid NDCG@10 |",
        "|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['count_bonus']:g} | {r['max_ring']} | {r['recall@10']:.4f} | {r['ndcg@10']:.4f} |"
        for r in row["validation"]
    ]
    return "\n".join(lines) + f"\n\n{row['validation'][0]['users']} validation users.\n"


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
    precision = args.choice()
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
        from peft_grounded.training.sft.recommendation_trainer import shallow_base

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
        from peft_grounded.sids.sasrec import SASRecConfig

        sasrec = SASRecConfig(max_minutes=0.2 if args.smoke else (args.sasrec_minutes or None))
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
        f"# Side by side: {catalogue.name}\n\nCommand: `python benchmarks/bench_side_by_side.py "
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
    if "tgh" in rows:
        table += tgh_choice(peers["tgh"][0])
    (out / "side_by_side.md").write_text(header + table)
    write_json_atomic(out / "side_by_side.json", {"summaries": summaries, "reference": reference})
    print(header + table, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
