"""One runner for every initialisation strategy, so that they differ only in how the new rows start.

A strategy = an initialisation (+ optionally the grounding stage). The runner, for each strategy:

1. adds the SID tokens to a fresh copy of the base model and wraps it with ``GroundedTokenConfig``;
2. saves the initial rows (``init/adapter``), for the diagnostics;
3. grounds the rows (``grounding/``) when the strategy asks for it;
4. stacks a LoRA (``add_lora``) and trains next-item SFT (``sft/``), logging validation Recall on the way;
5. decodes the validation and test users with the constrained beam search and writes ``metrics.json``.

Every stage resumes: a finished stage is loaded from its ``adapter/``, an interrupted one continues from
its last checkpoint, and a stage whose settings changed is refused (see :mod:`peft_grounded.runs`).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from .. import checks, runs
from .._io import read_json
from .._locks import locks_output
from ..evaluation.evaluator import evaluate
from ..evaluation.users import EvalSettings, item_token_ids
from ..models import sid_model
from ..prompts import PromptFormat
from ..runs import ADAPTER_DIR, CURVE_FILE, LOG_FILE, RESULTS_FILE
from ..saved_adapter import ADAPTER_WEIGHTS
from ..training import load_adapter_weights, save_adapter_atomic, upcast_trainable

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Strategy:
    """How the new rows start: an initialisation, optionally followed by grounding."""

    name: str
    init: str
    ground: bool = False
    description: str = ""
    # None: a grounded adapter; "peft": PEFT's own LoraConfig(trainable_token_indices=...), the baseline
    # (None keeps the manifests of runs recorded before the field existed resumable)
    adapter: str | None = None


STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy(
            "mean", "mean", description="every new row = the vocabulary mean (the GTI paper's baseline)"
        ),
        Strategy(
            "gaussian",
            "gaussian",
            description="draws from N(mean, cov) of the vocabulary (the centroid paper's baseline)",
        ),
        Strategy("random", "random", description="the model's initialiser, N(0, initializer_range)"),
        Strategy("centroid", "centroid", description="SID-region centroids, projected and mean-shifted"),
        Strategy("gti", "mean", ground=True, description="mean init, then grounding (GTI)"),
        Strategy(
            "centroid_gti",
            "centroid",
            ground=True,
            description="centroid init, then grounding (neither paper ran it)",
        ),
        Strategy(
            "peft_default",
            "mean",
            adapter="peft",
            description="without this package: mean_resizing + PEFT's LoraConfig(trainable_token_indices)",
        ),
    )
}


def strategy(name: str) -> Strategy:
    if name not in STRATEGIES:
        raise ValueError(f"Unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}.")
    return STRATEGIES[name]


DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}


@dataclass
class Budget:
    """The training and evaluation budget shared by all strategies of a comparison."""

    grounding_steps: int = 200
    sft_steps: int = 400
    batch_size: int = 16
    gradient_accumulation_steps: int = 1
    grounding_lr: float = 1e-3
    sft_lr: float = 5e-4
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = (
        0.0  # dropout on 200 LoRA inputs costs ~30% of a CPU step for no gain at small budgets
    )
    lora_target_modules: Any = "all-linear"
    max_length: int = 256
    bf16: bool = False  # bf16 autocast in the trainers
    # dtype the frozen base is loaded in ("bfloat16" halves its memory traffic); adapter weights stay float32
    weights_dtype: str = "float32"
    minutes: float | None = (
        None  # SFT training minutes (evaluation excluded), or sft_steps if sooner (0: time alone)
    )
    grounding_minutes: float | None = None  # the same for the grounding stage
    gradient_checkpointing: bool = False  # TRL turns it on by default; a 135M model does not need it
    seed: int = 0
    eval_users: int | None = None  # users decoded for valid/test (None: all)
    eval_every: int = 0  # validation Recall during SFT every N steps (0: off)
    # validation NLL during SFT every N steps, for the learning curve (None/0: off; None keeps older runs'
    # manifests, which lack the field, resumable)
    curve_every: int | None = None
    curve_users: int = 100  # the fixed seeded validation users of both
    # the parts decoded at the end (None: valid and test; None keeps older runs' manifests resumable)
    eval_parts: tuple[str, ...] | None = None
    ks: tuple[int, ...] = (1, 5, 10, 20)
    num_beams: int = 20
    eval_batch_size: int = 16
    # the evaluation leaves each user's history items out of its list (None: no; keeps older manifests)
    exclude_history: bool | None = None
    cold_max_count: int = 1
    centroid_variant: str = "items"
    max_train_examples: int | None = None  # sample of the SFT examples (None: all sliding windows)
    max_grounding_examples: int | None = None  # sample of the grounding pairs (None: all)
    logging_steps: int = 10
    save_steps: int = 100
    show_progress: bool = True

    def __post_init__(self) -> None:
        name = DTYPE_ALIASES.get(self.weights_dtype, self.weights_dtype)
        if name not in ("float32", "bfloat16", "float16"):
            raise ValueError(
                f"weights_dtype={self.weights_dtype!r}: use 'float32', 'bfloat16' or 'float16' "
                f"(aliases: {', '.join(DTYPE_ALIASES)})."
            )
        self.weights_dtype = name
        for field_name in ("minutes", "grounding_minutes"):
            value = getattr(self, field_name)
            if value is not None and not (checks.is_number(value) and value > 0):
                raise ValueError(f"{field_name}={value}: a time budget must be positive (or None for none).")
        unknown = set(self.eval_parts or ()) - {"valid", "test"}
        if unknown or (self.eval_parts is not None and not self.eval_parts):
            raise ValueError(
                f"eval_parts={self.eval_parts!r}: name 'valid' and/or 'test' (or None for both)."
            )
        checks.raise_problems("Budget", self._problems())
        self.eval_settings()  # the evaluation settings it implies, checked now rather than after training

    def grounding_problem(self) -> str | None:
        """Why this budget cannot run a grounding stage (no steps and no minutes), or None."""
        return checks.int_at_least(
            "grounding_steps", self.grounding_steps, 0 if self.grounding_minutes else 1
        )

    def _problems(self) -> list[str | None]:
        """Every field out of range (a stage's steps may be 0 when its minutes end it; the grounding's are
        checked by :meth:`grounding_problem` for the strategies that ground)."""
        least, number = checks.int_at_least, checks.number_in
        return [
            least("grounding_steps", self.grounding_steps, 0),
            least("sft_steps", self.sft_steps, 0 if self.minutes else 1),
            least("batch_size", self.batch_size, 1),
            least("gradient_accumulation_steps", self.gradient_accumulation_steps, 1),
            number("grounding_lr", self.grounding_lr, 0, low_open=True),
            number("sft_lr", self.sft_lr, 0, low_open=True),
            least("lora_r", self.lora_r, 1),
            number("lora_alpha", self.lora_alpha, 0, low_open=True),
            number("lora_dropout", self.lora_dropout, 0, 1, high_open=True),
            least("max_length", self.max_length, 1),
            checks.seed("seed", self.seed),
            least("eval_every", self.eval_every, 0),
            least("curve_every", self.curve_every, 0, none_ok=True),
            least("curve_users", self.curve_users, 1),
            checks.one_of("centroid_variant", self.centroid_variant, ("items", "codebook")),
            least("max_train_examples", self.max_train_examples, 1, none_ok=True),
            least("max_grounding_examples", self.max_grounding_examples, 1, none_ok=True),
            least("logging_steps", self.logging_steps, 1),
            least("save_steps", self.save_steps, 1),
        ]

    @property
    def parts(self) -> tuple[str, ...]:
        """The split parts evaluated at the end of a run."""
        return tuple(self.eval_parts) if self.eval_parts else ("valid", "test")

    @property
    def dtype(self) -> torch.dtype:
        """The frozen base's dtype (adapter weights always train in float32)."""
        return getattr(torch, self.weights_dtype)

    def eval_settings(self, **overrides) -> EvalSettings:
        """The evaluation settings this budget implies (``overrides`` replace fields)."""
        base = EvalSettings(
            ks=tuple(self.ks),
            users=self.eval_users,
            seed=self.seed,
            num_beams=self.num_beams,
            batch_size=self.eval_batch_size,
            cold_max_count=self.cold_max_count,
            bf16=self.bf16,
            exclude_history=bool(self.exclude_history),
        )
        return replace(base, **overrides)


@dataclass
class Experiment:
    """The data every strategy of a comparison shares."""

    model_path: str
    catalogue: Any
    index: Any
    split: Any = None
    fmt: PromptFormat = field(default_factory=PromptFormat)

    def __post_init__(self) -> None:
        if self.split is None:
            self.split = self.catalogue.leave_one_out()


def _stage_done(directory: Path) -> bool:
    return (directory / ADAPTER_DIR / ADAPTER_WEIGHTS).is_file() and (directory / runs.MANIFEST).is_file()


def _resume_point(directory: Path, resume: bool) -> bool | None:
    return True if resume and runs.checkpoints(directory) else None


def _is_main_process() -> bool:
    """Whether this process writes the runner's files (rank 0 under ``torchrun`` / ``accelerate launch``)."""
    return int(os.environ.get("RANK", "0")) == 0


def _wait_for_everyone() -> None:
    """A barrier between the processes of a distributed launch (none in one process)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from accelerate import PartialState

        PartialState().wait_for_everyone()


def _write_json(path: Path, value: Any) -> None:
    if _is_main_process():
        runs.write_json_atomic(path, value)


@locks_output("output_dir", "strategy run")
def run_strategy(
    name: str, experiment: Experiment, budget: Budget, output_dir: str | Path, resume: bool = False
) -> dict:
    """Run one strategy end to end; returns (and writes to ``metrics.json``) its results.

    Training goes through the same :func:`~peft_grounded.grounding.ground` and
    :func:`~.trainer.train_recommender` the CLI uses, on one live model. Under a distributed launch every
    process trains and evaluates; only the main one writes files (and holds ``output_dir``'s lock).
    """
    from ..decoding import SIDTrie
    from ..grounding import GroundingConfig, ground
    from .curves import LogHistory, ValidationLikelihood, ValidationRecall, learning_curve
    from .trainer import RecommendationConfig, train_recommender

    spec = strategy(name)
    if spec.ground:
        checks.raise_problems("Budget", [budget.grounding_problem()])
    out = Path(output_dir)
    manifest = {
        "strategy": asdict(spec),
        "budget": asdict(budget),
        "model": experiment.model_path,
        "index": experiment.index.fingerprint(),
        "format": asdict(experiment.fmt),
    }
    recorded = _claim(out, manifest, resume, name)
    if recorded is not None:  # finished earlier: nothing to train or decode again
        return recorded if "likelihood" in recorded else _add_likelihood(recorded, experiment, budget, out)
    started = time.perf_counter()
    torch.manual_seed(budget.seed)
    if spec.adapter == "peft":
        from ..peers.peft_default import peft_default_model

        tokenizer, model = peft_default_model(
            experiment.model_path, experiment.index, _lora(budget), dtype=budget.dtype
        )
    else:
        tokenizer, model = sid_model(
            experiment.model_path,
            experiment.index,
            init=spec.init,
            centroid_variant=budget.centroid_variant,
            seed=budget.seed,
            fmt=experiment.fmt,
            dtype=budget.dtype,
        )
    if _is_main_process():
        save_adapter_atomic(model, out / "init" / ADAPTER_DIR)
    common = dict(
        per_device_train_batch_size=budget.batch_size,
        logging_steps=budget.logging_steps,
        gradient_accumulation_steps=budget.gradient_accumulation_steps,
        max_length=budget.max_length,
        bf16=budget.bf16,
        gradient_checkpointing=budget.gradient_checkpointing,
        seed=budget.seed,
        save_steps=budget.save_steps,
        use_cpu=not torch.cuda.is_available(),
        disable_tqdm=not budget.show_progress,
        dataloader_num_workers=0,
    )
    timings, curves = {}, {}
    grounding_log, sft_log = LogHistory(), LogHistory()  # every rank's own copy (files: main only)
    if spec.ground:
        stage = out / "grounding"
        t = time.perf_counter()
        if resume and _stage_done(stage):
            load_adapter_weights(model, stage / ADAPTER_DIR)
        else:
            args = GroundingConfig(
                output_dir=str(stage),
                max_steps=budget.grounding_steps,
                learning_rate=budget.grounding_lr,
                max_minutes=budget.grounding_minutes,
                **common,
            )
            ground(
                experiment.catalogue,
                experiment.index,
                args,
                max_examples=budget.max_grounding_examples,
                resume=resume,
                model=model,
                tokenizer=tokenizer,
                callbacks=[grounding_log],
            )
        timings["grounding_s"] = time.perf_counter() - t
        curves["grounding"] = learning_curve(grounding_log.entries or _log_history(stage))
    trie = SIDTrie(item_token_ids(tokenizer, experiment.index))
    curve_settings = budget.eval_settings(
        users=budget.curve_users, seed=budget.seed + 1, ks=(5, 10), cold=False
    )

    def validation(live_model, ranking: bool) -> dict:
        """The fixed validation users' Recall/NDCG (``ranking``) or target NLL, for the learning curves."""
        result = evaluate(
            live_model,
            tokenizer,
            experiment.split,
            experiment.index,
            experiment.catalogue,
            experiment.fmt,
            ("valid",),
            curve_settings,
            trie,
            ranking=ranking,
            likelihood=not ranking,
        )
        return (result.metrics if ranking else result.likelihood)["valid"]["all"]

    def recall(live_model) -> dict:
        return validation(live_model, ranking=True)

    def likelihood(live_model) -> dict:
        return validation(live_model, ranking=False)

    stage = out / "sft"
    t = time.perf_counter()
    if resume and _stage_done(stage):
        from ..adapter import add_lora

        if spec.adapter != "peft":
            add_lora(model, **_lora(budget))
        upcast_trainable(model)  # the LoRA in float32, as it trained
        load_adapter_weights(model, stage / ADAPTER_DIR)
    else:
        args = RecommendationConfig(
            output_dir=str(stage),
            max_steps=budget.sft_steps,
            learning_rate=budget.sft_lr,
            max_minutes=budget.minutes,
            **common,
        )
        train_recommender(
            experiment.catalogue,
            experiment.index,
            args,
            lora=None if spec.adapter == "peft" else _lora(budget),
            fmt=experiment.fmt,
            max_examples=budget.max_train_examples,
            resume=resume,
            model=model,
            tokenizer=tokenizer,
            split=experiment.split,
            callbacks=[
                ValidationRecall(recall, budget.eval_every),
                ValidationLikelihood(likelihood, budget.curve_every or 0),
                sft_log,
            ],
        )
    timings["sft_s"] = time.perf_counter() - t
    history = sft_log.entries or _log_history(stage)  # a stage finished earlier: its file
    curves["sft"] = learning_curve(history)
    recall_curve = [
        {"step": e["step"], **{k[len("eval_") :]: v for k, v in e.items() if k.startswith("eval_")}}
        for e in history
        if "step" in e and any(k.startswith("eval_recall@") for k in e)
    ]
    _write_json(out / CURVE_FILE, curves)
    t = time.perf_counter()
    evaluation = evaluate(  # rankings, likelihoods and per-user records in one pass
        model,
        tokenizer,
        experiment.split,
        experiment.index,
        experiment.catalogue,
        experiment.fmt,
        budget.parts,
        budget.eval_settings(),
        trie,
    )
    results, likelihoods = evaluation.metrics, evaluation.likelihood
    timings["eval_s"] = time.perf_counter() - t
    timings["total_s"] = time.perf_counter() - started
    record = {
        "strategy": name,
        "run": runs.fingerprint(manifest),
        "description": spec.description,
        "metrics": results,
        "likelihood": likelihoods,
        "users": evaluation.users,
        "validation_curve": recall_curve,
        "curve": curves,
        "eval_users": budget.eval_users,
        "timings": timings,
        "threads": torch.get_num_threads(),
        "stages": _stage_dirs(spec),
    }
    _write_json(out / RESULTS_FILE, record)
    return record


def _lora(budget: Budget) -> dict:
    return dict(
        r=budget.lora_r,
        lora_alpha=budget.lora_alpha,
        lora_dropout=budget.lora_dropout,
        target_modules=budget.lora_target_modules,
    )


def _log_history(stage: Path) -> list[dict]:
    """The loss log a stage's trainer wrote (empty when there is none)."""
    path = stage / LOG_FILE
    return read_json(path) if path.is_file() else []


def _add_likelihood(record: dict, experiment: Experiment, budget: Budget, out: Path) -> dict:
    """Measure the likelihoods of a run finished before they were recorded (loads its SFT adapter)."""
    tokenizer, model = sid_model(
        experiment.model_path,
        experiment.index,
        adapter=str(out / "sft" / ADAPTER_DIR),
        is_trainable=False,
        dtype=budget.dtype,
    )
    measured = evaluate(
        model,
        tokenizer,
        experiment.split,
        experiment.index,
        experiment.catalogue,
        experiment.fmt,
        budget.parts,
        budget.eval_settings(),
        ranking=False,
    )
    record = record | {"likelihood": measured.likelihood}
    _write_json(out / RESULTS_FILE, record)
    return record


def _claim(out: Path, manifest: dict, resume: bool, name: str) -> dict | None:
    """Record the run in ``out``; refuse a directory holding something else, or another run's results.

    Returns the recorded results when resuming a run that had finished. Every process checks; after a
    barrier only the main one writes (so no process reads what another just wrote)."""
    finished = None
    if (out / runs.MANIFEST).is_file():
        if not resume:
            raise runs.RunMismatchError(
                f"{out} already holds a run; pass resume=True to continue it, or choose another directory "
                "(nothing was changed)."
            )
        runs.check_run(out, manifest, out)
        finished = _recorded_results(out / RESULTS_FILE, manifest, name)
    elif out.exists() and any(out.iterdir()):
        raise runs.RunMismatchError(
            f"{out} is not empty and holds no run of this runner; choose another directory."
        )
    _wait_for_everyone()
    _write_json(out / runs.MANIFEST, manifest)
    return finished


def _recorded_results(path: Path, manifest: dict, name: str) -> dict | None:
    """The runner's results in ``path`` (None when there are none); refuses a file another tool wrote
    there (``peft-grounded evaluate --output`` and ``diagnose --out`` also write a ``metrics.json``)."""
    if not path.is_file():
        return None
    record = read_json(path, fix="move it away to re-evaluate this run")
    fingerprint = runs.fingerprint(manifest)
    ours = isinstance(record, dict) and record.get("strategy") == name and "metrics" in record
    if not ours or record.get("run", fingerprint) != fingerprint:
        raise runs.RunMismatchError(
            f"{path} is not this run's results (another tool, or another run, wrote it); move it away to "
            "re-evaluate this run, and point evaluate/diagnose outputs to other folders."
        )
    return record


def _stage_dirs(spec: Strategy) -> dict[str, str]:
    """Adapter directory of each stage, relative to the strategy's folder (which can then be moved)."""
    stages = ["init", *(["grounding"] if spec.ground else []), "sft"]
    return {stage: f"{stage}/{ADAPTER_DIR}" for stage in stages}
