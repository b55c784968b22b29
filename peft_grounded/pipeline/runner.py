"""One runner for every initialisation strategy, so that they differ only in how the new rows start.

A strategy = an initialisation (+ optionally the grounding stage). The runner, for each strategy:

1. adds the SID tokens to a fresh copy of the base model and wraps it with ``GroundedTokenConfig``;
2. saves the initial rows (``init/adapter``), for the diagnostics;
3. grounds the rows (``grounding/``) when the strategy asks for it;
4. stacks a LoRA (``add_lora``) and trains next-item SFT (``sft/``), logging validation Recall on the way;
5. decodes the validation and test users with the constrained beam search and writes ``metrics.json``.

Every stage resumes: a finished stage is loaded from its ``adapter/``, an interrupted one continues from
its last checkpoint, and a stage whose settings changed is refused (see :mod:`peft_grounded.training.runs`).

Full fine-tuning of the base's decoder blocks, the reference row of a recipe comparison
(:func:`unfreeze_blocks`, :class:`BlockLearningRate`), is below.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from .._io import locks_output, read_json
from ..adapter.saved import ADAPTER_WEIGHTS
from ..decoding.trie import item_token_ids
from ..evaluation.evaluator import evaluate
from ..sids.extended_base import sid_model
from ..training import runs
from ..training.runs import (
    ADAPTER_DIR,
    CURVE_FILE,
    LOG_FILE,
    RESULTS_FILE,
    load_adapter_weights,
    save_adapter_atomic,
)
from ..training.steps import upcast_trainable
from .budget import Budget, Experiment, Strategy, strategy

logger = logging.getLogger(__name__)


def _stage_done(directory: Path) -> bool:
    return (directory / ADAPTER_DIR / ADAPTER_WEIGHTS).is_file() and (directory / runs.MANIFEST).is_file()


def _is_main_process() -> bool:
    """Whether this process writes the runner's files (rank 0 under ``torchrun`` / ``accelerate launch``)."""
    from accelerate import PartialState

    return PartialState().is_main_process


def _wait_for_everyone() -> None:
    """A barrier between the processes of a distributed launch (none in one process)."""
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

    Training goes through the same :func:`~peft_grounded.training.grounding.ground` and
    :func:`~.trainer.train_recommender` the CLI uses, on one live model. Under a distributed launch every
    process trains and evaluates; only the main one writes files (and holds ``output_dir``'s lock).
    """
    from ..decoding import SIDTrie
    from ..training.callbacks import LogHistory, ValidationLikelihood, ValidationRecall, learning_curve
    from ..training.grounding import ground
    from ..training.sft.recommendation_trainer import train_recommender

    spec = strategy(name)
    grounding = budget.grounding_config() if spec.ground else None  # refused before any work
    out = Path(output_dir)
    manifest = {
        "strategy": asdict(spec),
        "budget": budget.record(),
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
        from ..sids.extended_base import peft_default_model

        tokenizer, model = peft_default_model(
            experiment.model_path, experiment.index, budget.lora, dtype=budget.dtype
        )
    else:
        tokenizer, model = sid_model(
            experiment.model_path,
            experiment.index,
            start=budget.row_start(spec.init),
            seed=budget.seed,
            fmt=experiment.fmt,
            dtype=budget.dtype,
        )
    if _is_main_process():
        save_adapter_atomic(model, out / "init" / ADAPTER_DIR)
    timings, curves = {}, {}
    grounding_log, sft_log = LogHistory(), LogHistory()  # every rank's own copy (files: main only)
    if spec.ground:
        stage = out / "grounding"
        t = time.perf_counter()
        if resume and _stage_done(stage):
            load_adapter_weights(model, stage / ADAPTER_DIR)
        else:
            ground(
                experiment.catalogue,
                experiment.index,
                replace(grounding, output_dir=str(stage)),
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

    # keep_best picks by the Recall of all validation users (or keep_best_users), not the curves' sample
    recall_settings = (
        replace(curve_settings, users=budget.keep_best_users) if budget.keep_best else curve_settings
    )

    def validation(live_model, ranking: bool) -> dict:
        """The fixed validation users' Recall/NDCG (``ranking``) or target NLL, for the learning curves."""
        result = _evaluate(
            live_model,
            tokenizer,
            experiment,
            ("valid",),
            recall_settings if ranking else curve_settings,
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
    extra_callbacks, lora = [], None if spec.adapter == "peft" else budget.lora
    if budget.block_lr is not None:  # the reference row: full fine-tuning of the blocks, decoded in place
        if stage.exists() and any(stage.iterdir()):
            raise runs.RunMismatchError(
                f"{stage} holds an earlier start of a run that fine-tunes the base's blocks (block_lr), which "
                "does not resume: the blocks are not saved with the adapter. Start it again in another folder."
            )
        extra_callbacks, lora = [BlockLearningRate(unfreeze_blocks(model), budget.block_lr)], False
    if resume and _stage_done(stage):
        from ..adapter import add_lora

        if spec.adapter != "peft":
            add_lora(model, **budget.lora)
        upcast_trainable(model)  # the LoRA in float32, as it trained
        load_adapter_weights(model, stage / ADAPTER_DIR)
    else:
        train_recommender(
            experiment.catalogue,
            experiment.index,
            replace(budget.sft, output_dir=str(stage)),
            lora=lora,
            fmt=experiment.fmt,
            max_examples=budget.max_train_examples,
            resume=resume,
            model=model,
            tokenizer=tokenizer,
            split=experiment.split,
            callbacks=[
                ValidationRecall(
                    recall,
                    budget.eval_every,
                    keep_best="recall@10" if budget.keep_best else None,
                    directory=stage / "best",
                ),
                ValidationLikelihood(likelihood, budget.curve_every or 0),
                sft_log,
                *extra_callbacks,
            ],
        )
    timings["sft_s"] = time.perf_counter() - t
    history = sft_log.entries or _log_history(stage)  # a stage finished earlier: its file
    curves["sft"] = learning_curve(history)
    recall_curve = [
        {
            "step": e["step"],
            **({"seconds": e["seconds"]} if "seconds" in e else {}),  # the training clock at that point
            **{k[len("eval_") :]: v for k, v in e.items() if k.startswith("eval_")},
        }
        for e in history
        if "step" in e and any(k.startswith("eval_recall@") for k in e)
    ]
    _write_json(out / CURVE_FILE, curves)
    t = time.perf_counter()
    # rankings, likelihoods and per-user records in one pass
    evaluation = _evaluate(model, tokenizer, experiment, budget.parts, budget.eval_settings(), trie)
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
        "eval_users": budget.evaluation.users,
        "timings": timings,
        "threads": torch.get_num_threads(),
        "stages": _stage_dirs(spec),
    }
    _write_json(out / RESULTS_FILE, record)
    return record


def _evaluate(model, tokenizer, experiment: Experiment, parts, settings, trie=None, **options):
    """:func:`~peft_grounded.evaluation.evaluator.evaluate` on the experiment's split, index, catalogue and
    prompt format."""
    return evaluate(
        model,
        tokenizer,
        experiment.split,
        experiment.index,
        experiment.catalogue,
        experiment.fmt,
        parts,
        settings,
        trie,
        **options,
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
    measured = _evaluate(model, tokenizer, experiment, budget.parts, budget.eval_settings(), ranking=False)
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
    there (``peft-grounded evaluate`` and ``diagnose`` also write a ``metrics.json`` into their
    ``--output_dir``)."""
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


# Full fine-tuning of the base's decoder blocks: the reference row of a recipe comparison.
#
# Instead of a stacked LoRA, every weight of the base's decoder blocks trains, at its own learning rate (full
# fine-tuning needs a far lower one than a LoRA or the new rows), in a separate optimizer group that follows the
# same schedule; the new rows still train through the grounded adapter at the SFT learning rate. The blocks are
# not part of the adapter, so such a run is decoded in place: it neither resumes nor keeps its best checkpoint
# (:class:`~.budget.Budget` and the runner refuse both), and LoRA stacking stays the package's documented path.


def decoder_blocks(model) -> torch.nn.ModuleList:
    """The decoder blocks of a (PEFT-wrapped) causal LM: ``<base>.model.layers`` (Llama, Qwen, Mistral, ...)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    blocks = getattr(getattr(base, "model", None), "layers", None)
    if not isinstance(blocks, torch.nn.ModuleList) or not len(blocks):
        raise ValueError(
            f"{type(base).__name__} has no decoder blocks at .model.layers; full fine-tuning of the blocks "
            "supports the decoder-only architectures that keep them there (Llama, Qwen, Mistral, ...)."
        )
    return blocks


def unfreeze_blocks(model) -> list[torch.nn.Parameter]:
    """Make every weight of the decoder blocks trainable; returns them (the embeddings and head stay frozen)."""
    params = list(decoder_blocks(model).parameters())
    for p in params:
        p.requires_grad_(True)
    return params


class BlockLearningRate(TrainerCallback):
    """Move ``params`` into their own optimizer group at ``learning_rate``, on the schedule of the others.

    Runs when training begins (the optimizer and scheduler exist, no step has been taken): the group's rate
    is ``learning_rate`` times the schedule's factor, as every other group's is its own base rate times it.
    """

    def __init__(self, params: list[torch.nn.Parameter], learning_rate: float) -> None:
        if not params:
            raise ValueError("BlockLearningRate needs the parameters it gives their own learning rate.")
        self.params, self.learning_rate = params, learning_rate

    def on_train_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
        if state.global_step:
            raise RuntimeError(
                "full fine-tuning of the blocks does not resume: the blocks are not saved with the adapter; "
                "start the run again in an empty folder."
            )
        ids = {id(p) for p in self.params}
        groups = optimizer.param_groups
        for group in groups:
            group["params"] = [p for p in group["params"] if id(p) not in ids]
        scheduler = getattr(lr_scheduler, "scheduler", lr_scheduler)  # accelerate wraps it
        if not isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):
            raise TypeError(
                f"full fine-tuning of the blocks follows a LambdaLR schedule (transformers' and the time budget's); "
                f"got {type(scheduler).__name__}."
            )
        factor = scheduler.lr_lambdas[0]
        optimizer.add_param_group(
            {
                "params": self.params,
                "lr": self.learning_rate * factor(scheduler.last_epoch),
                "initial_lr": self.learning_rate,
                "weight_decay": groups[0].get("weight_decay", 0.0),
            }
        )
        scheduler.base_lrs.append(self.learning_rate)
        scheduler.lr_lambdas.append(factor)
        return control
