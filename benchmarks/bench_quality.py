"""Recommendation quality of every initialisation strategy under one budget, over several seeds.

    python benchmarks/bench_quality.py --dataset movielens-100k --seeds 0 1 2
    python benchmarks/bench_quality.py --dataset /work/shared/data/amazon-office --seeds 0 1 2

For each (strategy, seed) the strategy runner trains SmolLM2-135M (init -> grounding for GTI strategies ->
LoRA SFT) and decodes the validation and test users with the SID-constrained beam search. Runs resume:
finished ones are read back. The script then prints (and writes to ``results.md`` / ``results.json``):

* Recall/NDCG@5/10/20 on all and cold test targets: mean ± std over seeds;
* relative changes for the papers' comparisons (centroid vs gaussian, GTI vs mean, ...);
* validation Recall@5 against SFT steps, and the steps each strategy needs to reach the mean baseline's
  best validation Recall@5 (the centroid paper's "fewer SFT steps");
* paired bootstrap 95% intervals of every strategy against mean init and against the most-popular ranking
  (R@K, N@K, constrained NLL; test users, all and cold; users resampled within each seed), from the
  per-user results each run records.

Settings the package declares are parsed from its dataclasses, under its flags: ``--strategies`` / ``--seeds``
(the demo's ``DemoArguments``; here every strategy and seeds 0 1 2 unless given), ``--levels`` / ``--codes``
(``build-sids``' ``BuildSIDsArguments``; here 3 x 64), ``--objective`` / ``--max_history`` (``sft``'s
``SFTArguments``; here the sequence objective, and ``--max_history`` None is 19 for sequence but 8 for prompt,
not the package's 10, as the runs of BENCHMARKS.md had), ``--max_length`` (``RecommendationConfig``'s, for both
stages; here 512) and ``--eval_every`` / ``--curve_every`` / ``--curve_users`` / ``--max_train_examples``
(the runner's ``Budget``; here 25 / 0 / 100 / 5000). ``--sample_users`` (also ``--users``, ``--eval-users``) is
the seeded sample of users decoded per part (``EvalSettings.users``), not ``sft``'s ``--eval_users``.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

from peft_grounded import assets
from peft_grounded.cli.common import SFTArguments
from peft_grounded.cli.demo import DemoArguments
from peft_grounded.cli.sids import BuildSIDsArguments
from peft_grounded.evaluation import (
    LIKELIHOOD_METRICS,
    POPULARITY_LABEL,
    EvalSettings,
    compare_users,
    evaluate_popularity,
    intervals_table,
    popularity_users,
)
from peft_grounded.pipeline import STRATEGIES, Budget, Experiment, run_strategy
from peft_grounded.prompts import PromptFormat
from peft_grounded.sids import SIDIndex, build_sids, load_catalogue
from peft_grounded.sids.index import JSON_NAME
from peft_grounded.training import runs
from peft_grounded.training.stage_config import RecommendationConfig

try:
    from benchmarks._args import Precision, package_fields, parse
except ModuleNotFoundError:  # run as a file: its folder is on sys.path, not the repository
    from _args import Precision, package_fields, parse

METRICS = ("recall@5", "recall@10", "recall@20", "ndcg@5", "ndcg@10", "ndcg@20")
CLAIMS = (  # (strategy, baseline, metric, subset, the papers' figure)
    ("centroid", "gaussian", "recall@5", "all", "+6.5% (centroid paper, average)"),
    ("centroid", "gaussian", "recall@5", "cold", "+37% (centroid paper, cold items)"),
    ("gti", "mean", "recall@10", "all", "+22% (GTI paper, Vibrent)"),
    ("gti", "mean", "recall@20", "all", "+26% (GTI paper, Vibrent)"),
    ("centroid_gti", "mean", "recall@10", "all", "(neither paper)"),
)


def _stats(values: list[float]) -> tuple[float, float]:
    values = [v for v in values if v is not None]
    if not values:
        return float("nan"), float("nan")
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def steps_to_reach(curve: list[dict], target: float, metric: str = "recall@5") -> int | None:
    """First SFT step whose validation ``metric`` reaches ``target``."""
    for point in curve:
        if point.get(metric) is not None and point[metric] >= target:
            return point["step"]
    return None


def summarise(records: dict[str, list[dict]], reference: list[dict] | None = None) -> tuple[str, dict]:
    """Markdown tables of ``records`` (strategy -> one record per seed) and the flat table they hold.

    ``reference``: per seed, :func:`~peft_grounded.evaluation.evaluate_popularity` on the same users.
    """
    lines, table = [], {}
    header = "| strategy | subset | " + " | ".join(METRICS) + " |"
    lines += [header, "|" + "---|" * (len(METRICS) + 2)]
    rows = dict(records)
    if reference:
        rows[POPULARITY_LABEL] = [{"metrics": r} for r in reference]
    for name, recs in rows.items():
        for subset in ("all", "cold"):
            cells = []
            for metric in METRICS:
                mean, std = _stats([r["metrics"]["test"][subset].get(metric) for r in recs])
                table[(name, subset, metric)] = mean
                cells.append(f"{mean:.4f} ± {std:.4f}")
            lines.append(f"| {name} | {subset} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Target log-likelihood on the same test users (nats per item, lower is better; constrained: under the "
        "SID trie, what the beam search ranks by; uniform: a model spreading its mass evenly over the trie):",
        "",
        "| strategy | subset | " + " | ".join(LIKELIHOOD_METRICS) + " |",
        "|" + "---|" * (len(LIKELIHOOD_METRICS) + 2),
    ]
    for name, recs in records.items():
        for subset in ("all", "cold"):
            cells = []
            for metric in LIKELIHOOD_METRICS:
                mean, std = _stats([r["likelihood"]["test"][subset].get(metric) for r in recs])
                table[(name, subset, metric)] = mean
                cells.append(f"{mean:.3f} ± {std:.3f}")
            lines.append(f"| {name} | {subset} | " + " | ".join(cells) + " |")
    for subset in ("all", "cold") if reference else ():
        mean, std = _stats([r["test"][subset].get("constrained_nll") for r in reference])
        table[(POPULARITY_LABEL, subset, "constrained_nll")] = mean
        lines.append(f"| {POPULARITY_LABEL} | {subset} | - | {mean:.3f} ± {std:.3f} | - |")
    lines += ["", "| comparison | metric | subset | ours | papers |", "|---|---|---|---|---|"]
    shown = set()
    for strategy, baseline, metric, subset, paper in CLAIMS:
        if strategy in records and baseline in records:
            ours, base = table[(strategy, subset, metric)], table[(baseline, subset, metric)]
            change = f"{100 * (ours - base) / base:+.1f}%" if base else "n/a (baseline 0)"
            lines.append(f"| {strategy} vs {baseline} | {metric} | {subset} | {change} | {paper} |")
            if (strategy, baseline, subset) not in shown:
                shown.add((strategy, baseline, subset))
                ours, base = (table[(name, subset, "constrained_nll")] for name in (strategy, baseline))
                lines.append(
                    f"| {strategy} vs {baseline} | constrained NLL | {subset} | {ours - base:+.3f} nats | - |"
                )
    if "mean" in records and all(r["validation_curve"] for recs in records.values() for r in recs):
        best = statistics.fmean(
            max(p["recall@5"] or 0 for p in r["validation_curve"]) for r in records["mean"]
        )
        lines += ["", f"SFT steps to reach the mean baseline's best validation Recall@5 ({best:.4f}):", ""]
        if best > 0:
            lines += ["| strategy | steps (per seed; None: not reached) |", "|---|---|"]
            for name, recs in records.items():
                lines.append(f"| {name} | {[steps_to_reach(r['validation_curve'], best) for r in recs]} |")
        else:
            lines.append("not measurable: the mean baseline never scored on the validation curve.")
    return "\n".join(lines), {"|".join(k): v for k, v in table.items()}


INTERVAL_METRICS = ("recall@5", "recall@10", "recall@20", "ndcg@10", "constrained_nll")


def intervals(
    records: dict[str, list[dict]], reference_users: list[dict] | None, resamples: int = 10_000
) -> tuple[str, list[dict]]:
    """Markdown and rows of the paired intervals: each strategy vs mean init and vs popularity, test users,
    all and cold targets, pooled over seeds (users resampled within each seed)."""
    users = {
        n: [r["users"]["test"] for r in recs]
        for n, recs in records.items()
        if all("users" in r for r in recs)
    }
    missing = sorted(set(records) - set(users))
    references = {}
    if "mean" in users:
        references["mean init"] = users["mean"]
    if reference_users:
        references[POPULARITY_LABEL] = [p["test"] for p in reference_users]
    named = {("mean init" if n == "mean" else n): v for n, v in users.items()}
    rows = []
    for subset in ("all", "cold"):
        rows += compare_users(named, references, INTERVAL_METRICS, subset, resamples=resamples)
    rows = [r for r in rows if r["users"]]
    lines = [
        "Paired bootstrap 95% intervals (strategy - reference), same test users, users resampled within seed:",
        "",
    ]
    lines.append(intervals_table(rows) if rows else "no per-user results to compare")
    if missing:
        lines.append(f"(no per-user results recorded for {', '.join(missing)}: runs predate them)")
    return "\n".join(lines), rows


def plot_curves(records: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, recs in records.items():
        steps = [p["step"] for p in recs[0]["validation_curve"]]
        if not steps:
            continue
        values = [
            statistics.fmean((r["validation_curve"][i]["recall@5"] or 0) for r in recs)
            for i in range(len(steps))
        ]
        ax.plot(steps, values, marker="o", label=name)
    ax.set_xlabel("SFT step")
    ax.set_ylabel("validation Recall@5 (mean over seeds)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


@dataclass(kw_only=True)
class Settings(Precision):
    """The catalogue, the strategies and seeds, and the budget every run shares (``--fp32`` / ``--bf16``: the
    base's precision and autocast; neither: the machine's choice, as the demo)."""

    dataset: str = field(default="movielens-100k", metadata={"help": "'movielens-100k' or a catalogue path"})
    output: Path | None = field(default=None, metadata={"help": "None: runs/bench_quality/<dataset name>"})
    grounding_steps: int = field(default=60, metadata={"help": "grounding steps of gti / centroid_gti"})
    sft_steps: int = field(default=150, metadata={"help": "SFT steps"})
    batch_size: int = field(default=8, metadata={"help": "rows per step of both stages"})
    # the users decoded per part (EvalSettings.users); --eval-users: benchmarks/gpu/gpu_run.py's flag of it
    sample_users: int = field(
        default=200,
        metadata={
            "help": "seeded sample of the users decoded per part (valid and test)",
            "aliases": ["--users", "--eval-users", "--eval_users"],
        },
    )
    minutes: float | None = field(
        default=None, metadata={"help": "SFT minutes per strategy (then --sft-steps 0: time alone)"}
    )
    grounding_minutes: float | None = field(
        default=None, metadata={"help": "grounding minutes of gti / centroid_gti"}
    )
    resamples: int = field(default=10_000, metadata={"help": "bootstrap resamples of the intervals"})


# the settings the package declares, parsed under its flags (the script's own defaults: DEFAULTS)
DemoFields = package_fields(DemoArguments, "strategies", "seeds")
SIDFields = package_fields(BuildSIDsArguments, "levels", "codes")
SFTFields = package_fields(SFTArguments, "objective", "max_history")
StageFields = package_fields(RecommendationConfig, "max_length")
BudgetFields = package_fields(Budget, "eval_every", "curve_every", "curve_users", "max_train_examples")
DEFAULTS = {
    "strategies": list(STRATEGIES),
    "seeds": [0, 1, 2],
    "codes": "64",
    "objective": "sequence",
    "max_length": 512,
    "eval_every": 25,
    "curve_every": 0,
    "max_train_examples": 5000,
}
PROMPT_HISTORY = 8  # --max_history None with the prompt objective, here (the package's None: 10)


def strategies_of(demo) -> list[str]:
    """``--strategies`` as the demo reads it (spaces or commas), each a known strategy."""
    names = [name for given in demo.strategies for name in given.split(",") if name]
    unknown = sorted(set(names) - set(STRATEGIES))
    if unknown or not names:
        raise SystemExit(f"--strategies {demo.strategies}: give some of {' '.join(STRATEGIES)}")
    return names


def max_history_of(sft) -> int:
    """``--max_history``, None resolved as here: 19 for sequence (chunks of 20), 8 for prompt."""
    if sft.max_history is not None:
        return sft.max_history
    return 19 if sft.objective == "sequence" else PROMPT_HISTORY


def check(args, demo, sids, sft, stage, budget) -> dict:
    codes = BuildSIDsArguments.code_counts(sids)
    if not isinstance(codes, int) and sids.levels is not None and sids.levels != len(codes):
        raise SystemExit(f"--levels {sids.levels} but --codes lists {len(codes)} levels ({sids.codes})")
    return {"strategies": strategies_of(demo), "seeds": demo.seeds, "max_history": max_history_of(sft)}


def parse_args(argv=None) -> tuple:
    """``args, demo, sids, sft, stage, budget``: the script's settings and the package's parsed beside them."""
    return parse(
        (Settings, DemoFields, SIDFields, SFTFields, StageFields, BudgetFields),
        argv,
        prog="bench_quality.py",
        description=__doc__,
        check=check,
        defaults=DEFAULTS,
    )


def main(argv=None) -> None:
    args, demo, sids, sft, stage, budget_fields = parse_args(argv)
    bf16 = args.choice().bf16
    strategies = strategies_of(demo)

    name = Path(args.dataset).name or args.dataset
    out = args.output or Path("runs/bench_quality") / name
    catalogue = load_catalogue(args.dataset)
    if (out / "sids" / JSON_NAME).is_file():
        index = SIDIndex.load(out / "sids")
    else:
        index = build_sids(
            catalogue,
            out / "sids",
            levels=sids.levels,
            codes=BuildSIDsArguments.code_counts(sids),
            text_template=["title", "brand", "categories", "release_year", "description"],
        )
    print(index.summary(), flush=True)
    training = dict(
        per_device_train_batch_size=args.batch_size,
        max_length=stage.max_length,
        bf16=bf16,
        save_steps=max(args.sft_steps // 2, 1),
        logging_steps=10,
    )
    budget = Budget.from_training(
        training,
        grounding=dict(
            max_steps=args.grounding_steps, learning_rate=5e-3, max_minutes=args.grounding_minutes
        ),
        sft=dict(max_steps=args.sft_steps, learning_rate=1e-3, max_minutes=args.minutes),
        lora=dict(r=8, lora_alpha=16),
        evaluation=EvalSettings(users=args.sample_users, bf16=bf16),
        weights_dtype="bfloat16" if bf16 else "float32",
        eval_every=budget_fields.eval_every,
        curve_every=budget_fields.curve_every,
        curve_users=budget_fields.curve_users,
        max_train_examples=budget_fields.max_train_examples,
        max_grounding_examples=None,
    )
    fmt = PromptFormat(objective=sft.objective, max_history=max_history_of(sft))
    experiment = Experiment(str(assets.smollm2()), catalogue, index, fmt=fmt)
    records: dict[str, list[dict]] = {}
    for seed in demo.seeds:
        for strategy in strategies:
            run_dir = out / f"{strategy}-seed{seed}"
            if not (run_dir / "metrics.json").is_file():
                print(f"[bench] {name}: {strategy} seed {seed}", flush=True)
            # finished runs are read back (and given the likelihoods if they predate them)
            record = run_strategy(strategy, experiment, budget.with_seed(seed), run_dir, resume=True)
            records.setdefault(strategy, []).append(record)
    settings = {seed: budget.with_seed(seed).eval_settings() for seed in demo.seeds}
    reference = [
        evaluate_popularity(experiment.split, settings=settings[seed], items=index.item_ids)
        for seed in demo.seeds
    ]
    reference_users = [
        popularity_users(experiment.split, settings=settings[seed], items=index.item_ids)
        for seed in demo.seeds
    ]
    text, table = summarise(records, reference)
    interval_text, interval_rows = intervals(records, reference_users, args.resamples)
    text += "\n\n" + interval_text
    plot_curves(records, out / "validation_recall5.png")
    header = (
        f"## {name}: SmolLM2-135M, {len(demo.seeds)} seeds, grounding {args.grounding_steps} + SFT "
        f"{args.sft_steps} steps at batch {args.batch_size}"
        f"{f', {args.minutes} min' if args.minutes else ''}, objective {sft.objective}, "
        f"{args.sample_users} test users\n\n"
    )
    (out / "results.md").write_text(header + text + "\n")
    # every setting of the run, the package's parsed beside the script's (max_history as resolved); the sample's
    # old key eval_users kept for readers of earlier results
    stored = asdict(args) | {"eval_users": args.sample_users, "output": str(out)}
    for parsed in (demo, sids, sft, stage, budget_fields):
        stored |= asdict(parsed)
    stored |= {"strategies": strategies, "max_history": max_history_of(sft)}
    runs.write_json_atomic(out / "results.json", {"table": table, "intervals": interval_rows, "args": stored})
    print(header + text)


if __name__ == "__main__":
    main()
