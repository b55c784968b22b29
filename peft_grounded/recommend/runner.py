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

import json
import logging
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from .. import runs
from ..evaluation.evaluator import evaluate, evaluate_likelihood, evaluate_model
from ..evaluation.users import EvalSettings, item_token_ids
from ..models import sid_model
from ..prompts import PromptFormat
from ..saved_adapter import ADAPTER_WEIGHTS
from ..training import ADAPTER_DIR, sample_rows, save_adapter_atomic
from .data import training_dataset

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Strategy:
    """How the new rows start: an initialisation, optionally followed by grounding."""

    name: str
    init: str
    ground: bool = False
    description: str = ""


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
    )
}


def strategy(name: str) -> Strategy:
    if name not in STRATEGIES:
        raise ValueError(f"Unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}.")
    return STRATEGIES[name]


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
    weights_dtype: str = (
        "float32"  # dtype the frozen base is loaded in ("bfloat16" halves its memory traffic)
    )
    gradient_checkpointing: bool = False  # TRL turns it on by default; a 135M model does not need it
    seed: int = 0
    eval_users: int | None = None  # users decoded for valid/test (None: all)
    eval_every: int = 0  # validation Recall during SFT every N steps (0: off)
    curve_users: int = 100
    ks: tuple[int, ...] = (1, 5, 10, 20)
    num_beams: int = 20
    eval_batch_size: int = 16
    cold_max_count: int = 1
    centroid_variant: str = "items"
    max_train_examples: int | None = None  # sample of the SFT examples (None: all sliding windows)
    max_grounding_examples: int | None = None  # sample of the grounding pairs (None: all)
    logging_steps: int = 10
    save_steps: int = 100
    show_progress: bool = True

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


def _load_rows(model, directory: Path) -> None:
    """Load a finished stage's adapter weights into the live adapter (same structure)."""
    from peft.utils import set_peft_model_state_dict
    from safetensors.torch import load_file

    state = load_file(str(directory / ADAPTER_WEIGHTS))
    result = set_peft_model_state_dict(model, state)
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise ValueError(f"{directory} does not fit this adapter (unexpected keys {unexpected[:3]}).")


def _stage_done(directory: Path) -> bool:
    return (directory / ADAPTER_DIR / ADAPTER_WEIGHTS).is_file() and (
        directory / runs.MANIFEST
    ).is_file()


def _resume_point(directory: Path, resume: bool) -> bool | None:
    return True if resume and runs.checkpoints(directory) else None


def run_strategy(
    name: str, experiment: Experiment, budget: Budget, output_dir: str | Path, resume: bool = False
) -> dict:
    """Run one strategy end to end; returns (and writes to ``metrics.json``) its results."""
    from ..adapter import add_lora
    from ..decoding import SIDTrie
    from ..grounding import GroundingConfig, GroundingTrainer, grounding_dataset
    from .trainer import RecommendationConfig, RecommendationTrainer, ValidationRecall

    spec = strategy(name)
    out = Path(output_dir)
    manifest = {
        "strategy": asdict(spec),
        "budget": asdict(budget),
        "model": experiment.model_path,
        "index": experiment.index.fingerprint(),
        "format": asdict(experiment.fmt),
    }
    recorded = _claim(out, manifest, resume)
    if recorded is not None:  # finished earlier: nothing to train or decode again
        return recorded if "likelihood" in recorded else _add_likelihood(recorded, experiment, budget, out)
    started = time.perf_counter()
    torch.manual_seed(budget.seed)
    tokenizer, model = sid_model(
        experiment.model_path,
        experiment.index,
        init=spec.init,
        centroid_variant=budget.centroid_variant,
        seed=budget.seed,
        fmt=experiment.fmt,
        dtype=getattr(torch, budget.weights_dtype),
    )
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
    timings = {}
    if spec.ground:
        stage = out / "grounding"
        t = time.perf_counter()
        if resume and _stage_done(stage):
            _load_rows(model, stage / ADAPTER_DIR)
        else:
            args = GroundingConfig(
                output_dir=str(stage),
                max_steps=budget.grounding_steps,
                learning_rate=budget.grounding_lr,
                **common,
            )
            data = sample_rows(
                grounding_dataset(experiment.catalogue, experiment.index, tokenizer),
                budget.max_grounding_examples,
                budget.seed,
            )
            GroundingTrainer(model, args, train_dataset=data, processing_class=tokenizer).train(
                resume_from_checkpoint=_resume_point(stage, resume)
            )
        timings["grounding_s"] = time.perf_counter() - t
    add_lora(
        model,
        r=budget.lora_r,
        lora_alpha=budget.lora_alpha,
        lora_dropout=budget.lora_dropout,
        target_modules=budget.lora_target_modules,
    )
    trie = SIDTrie(item_token_ids(tokenizer, experiment.index))
    curve_settings = budget.eval_settings(
        users=budget.curve_users, seed=budget.seed + 1, ks=(5, 10), cold=False
    )

    def validation(live_model) -> dict:
        return evaluate_model(
            model,
            tokenizer,
            experiment.split,
            experiment.index,
            experiment.catalogue,
            experiment.fmt,
            ("valid",),
            curve_settings,
            trie,
        )["valid"]["all"]

    stage = out / "sft"
    t = time.perf_counter()
    curve = []
    if resume and _stage_done(stage):
        _load_rows(model, stage / ADAPTER_DIR)
        curve = (
            json.loads((stage / "validation_curve.json").read_text())
            if (stage / "validation_curve.json").is_file()
            else []
        )
    else:
        args = RecommendationConfig(
            output_dir=str(stage), max_steps=budget.sft_steps, learning_rate=budget.sft_lr, **common
        )
        data = training_dataset(
            experiment.split, experiment.index, experiment.catalogue, tokenizer, experiment.fmt
        )
        data = sample_rows(data, budget.max_train_examples, budget.seed)
        callback = ValidationRecall(validation, budget.eval_every)
        RecommendationTrainer(
            model, args, train_dataset=data, processing_class=tokenizer, callbacks=[callback]
        ).train(resume_from_checkpoint=_resume_point(stage, resume))
        curve = callback.curve
        runs.write_json_atomic(stage / "validation_curve.json", curve)
    timings["sft_s"] = time.perf_counter() - t
    t = time.perf_counter()
    evaluation = evaluate(  # rankings, likelihoods and per-user records in one pass
        model,
        tokenizer,
        experiment.split,
        experiment.index,
        experiment.catalogue,
        experiment.fmt,
        ("valid", "test"),
        budget.eval_settings(),
        trie,
    )
    results, likelihood = evaluation.metrics, evaluation.likelihood
    timings["eval_s"] = time.perf_counter() - t
    timings["total_s"] = time.perf_counter() - started
    record = {
        "strategy": name,
        "description": spec.description,
        "metrics": results,
        "likelihood": likelihood,
        "users": evaluation.users,
        "validation_curve": curve,
        "eval_users": budget.eval_users,
        "timings": timings,
        "stages": _stage_dirs(spec),
    }
    runs.write_json_atomic(out / "metrics.json", record)
    return record


def _likelihood(model, tokenizer, experiment: Experiment, budget: Budget, trie=None) -> dict:
    """The target SIDs' log-likelihoods on the users the metrics were measured on."""
    return evaluate_likelihood(
        model,
        tokenizer,
        experiment.split,
        experiment.index,
        experiment.catalogue,
        experiment.fmt,
        ("valid", "test"),
        budget.eval_settings(),
        trie,
    )


def _add_likelihood(record: dict, experiment: Experiment, budget: Budget, out: Path) -> dict:
    """Measure the likelihoods of a run finished before they were recorded (loads its SFT adapter)."""
    tokenizer, model = sid_model(
        experiment.model_path,
        experiment.index,
        adapter=str(out / "sft" / ADAPTER_DIR),
        is_trainable=False,
        dtype=getattr(torch, budget.weights_dtype),
    )
    record = record | {"likelihood": _likelihood(model, tokenizer, experiment, budget)}
    runs.write_json_atomic(out / "metrics.json", record)
    return record


def _claim(out: Path, manifest: dict, resume: bool) -> dict | None:
    """Record the run in ``out``; refuse a directory holding something else, or another run's results.

    Returns the recorded results when resuming a run that had finished."""
    if (out / runs.MANIFEST).is_file():
        if not resume:
            raise runs.RunMismatchError(
                f"{out} already holds a run; pass resume=True to continue it, or choose another directory "
                "(nothing was changed)."
            )
        runs.check_and_write(out, manifest, out)
        metrics = out / "metrics.json"
        return json.loads(metrics.read_text()) if metrics.is_file() else None
    if out.exists() and any(out.iterdir()):
        raise runs.RunMismatchError(
            f"{out} is not empty and holds no run of this runner; choose another directory."
        )
    runs.check_and_write(out, manifest, None)
    return None


def _stage_dirs(spec: Strategy) -> dict[str, str]:
    """Adapter directory of each stage, relative to the strategy's folder (which can then be moved)."""
    stages = ["init", *(["grounding"] if spec.ground else []), "sft"]
    return {stage: f"{stage}/{ADAPTER_DIR}" for stage in stages}
