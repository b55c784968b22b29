"""The part every stage's trainer shares: an ``SFTTrainer`` that knows its run.

:class:`RunTrainer` records a run manifest (see :mod:`peft_grounded.training.runs`), copies it into every checkpoint,
refuses to resume from or write next to another run's checkpoints (or a finished run's adapter), keeps the
loss log as JSON and writes the final adapter atomically to ``<output_dir>/adapter``. Nothing is lost:

* the output folder is locked (:mod:`peft_grounded._io`): a second trainer aimed at it stops at once;
* every checkpoint is written into ``.checkpoint-N.partial`` and renamed into place when complete, so a
  kill or a full disk at any instant leaves the last complete checkpoint; a resume skips (and moves
  aside) an incomplete checkpoint (written otherwise, or damaged since), saying so;
* resuming a finished run is a no-op that says so (the adapter and the log are left as they are), and a
  run killed after its last checkpoint but before its adapter is finished from that checkpoint;
* TRL's draft model card does not replace a ``README.md`` of the user's in the output folder.

It also

* trains every adapter weight in float32 (master weights), whatever the base's dtype;
* refuses rows that ``max_length`` would cut (TRL truncates silently, and a cut SID trains on garbage);
* keeps a :class:`~peft_grounded.training.callbacks.TrainingClock`: each loss log gets ``seconds`` (training
  time) and ``items_seen`` (item targets so far, a target = one labelled SID), and ``max_minutes`` stops
  the run at a training time with a learning rate that decays linearly to 0 at that time.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from accelerate.utils import extract_model_from_parallel
from transformers.trainer_callback import ProgressCallback
from transformers.trainer_utils import TrainOutput
from trl import SFTTrainer

from .._io import DiskFullError, is_disk_full, output_lock, read_json
from . import runs
from .callbacks import TimeProgressCallback, TrainingClock, time_schedule
from .runs import (
    ADAPTER_DIR,
    LOG_FILE,
    SafeCheckpoints,
    check_own_file,
    checkpoint_state,
    dataset_fingerprint,
    load_adapter_weights,
    remove_leftovers,
    sample_rows,
    save_adapter_atomic,
    stopped,
    train_loss,
)
from .stage_config import check_max_examples, wants_padding_free
from .steps import count_targets, training_kernels, upcast_trainable

if TYPE_CHECKING:
    from ..prompts import PromptFormat
    from ..sids.extended_base import RowStart

logger = logging.getLogger(__name__)


# adapter-config fields that do not define a run (a run resumes after a PEFT upgrade)
NOT_IN_MANIFEST = ("inference_mode", "peft_version")
UNLIMITED_STEPS = 10**9  # max_steps when only a time budget ends the run


def _time_factor(clock: TrainingClock, warmup_ratio: float, _step: int) -> float:
    return time_schedule(clock.fraction(), warmup_ratio)


def _head_wrapped_by_peft(model) -> bool:
    """Whether PEFT's ``TrainableTokensWrapper`` replaced the output embedding (trainable tokens, tied head)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return type(head).__name__ == "TrainableTokensWrapper"


class RunTrainer(SafeCheckpoints, SFTTrainer):
    """``SFTTrainer`` with a run manifest, checked resumes, a JSON loss log and an atomic final adapter."""

    stage = "sft"

    def __init__(self, model, args=None, *, max_examples: int | None = None, **kwargs) -> None:
        """``SFTTrainer``'s arguments; ``max_examples``: train on a sample of that many rows of ``train_dataset``
        (seeded by ``args.seed``; None: every row)."""
        _refuse_cloned_chat_template(args)
        if max_examples is not None and kwargs.get("train_dataset") is not None:
            seed = args.seed if args is not None else 0
            kwargs["train_dataset"] = sample_rows(kwargs["train_dataset"], max_examples, seed)
        train_dataset = kwargs.get("train_dataset")
        data = dataset_fingerprint(train_dataset)
        upcast_trainable(model)
        if args is not None and getattr(args, "max_minutes", None) is not None and args.max_steps <= 0:
            args.max_steps = UNLIMITED_STEPS
        # Padding-free batches (TRL's padding_free: a batch's rows concatenated into one, positions restarting
        # at each row) leave max_length to this trainer: TRL refuses it there, since it cuts no row then; the
        # rows are checked against it below, and nothing is cut.
        if args is not None and args.padding_free is None:
            batch, device = args.per_device_train_batch_size, args.device.type
            args.padding_free = wants_padding_free(train_dataset, batch, args.seed, device_type=device)
        row_limit = None
        if args is not None and args.padding_free and not args.packing and args.max_length is not None:
            row_limit, args.max_length = args.max_length, None
        try:
            super().__init__(model=model, args=args, **kwargs)
        finally:
            if row_limit is not None:
                args.max_length = row_limit
        self._check_truncation(train_dataset)
        self._sid_softmax = self._resolve_sid_softmax()  # before the manifest: the adapter records it
        self.manifest = self.build_manifest(data)
        self._staging: Path | None = None  # while a checkpoint is written: its .partial folder
        self._card_kept = False  # the output folder holds the user's README.md: TRL's card is not written
        self.clock = TrainingClock(getattr(self.args, "max_minutes", None), self.args.device)
        self.add_callback(self.clock)
        if self.clock.minutes is not None and self.pop_callback(ProgressCallback) is not None:
            self.add_callback(TimeProgressCallback(self.clock))  # a bar over the time budget, not 10**9 steps
        for callback in self.callback_handler.callbacks:
            if getattr(callback, "wants_clock", False):
                callback.clock = self.clock  # evaluation callbacks pause the training clock
        self._pending = torch.zeros(2, dtype=torch.long)  # [labelled tokens, item targets] not yet counted
        self._since_log = [0, 0]  # the same, counted since the last loss log
        self.clock.flush = self._flush_counts
        # DataParallel copies each module's __dict__ to its replicas: the compact head would run on the original
        self._compact_loss = bool(getattr(self.args, "compact_loss", False)) and self.args.n_gpu <= 1

    def _resolve_sid_softmax(self) -> bool:
        """Whether SID targets take the SID-only softmax: ``sid_softmax`` True (refused, before any step,
        where the SID-only head cannot compute the loss), False, or None: on wherever it applies. The choice
        is written back into the args (the saved config says what ran) and handed to
        :meth:`record_sid_softmax`."""
        requested = getattr(self.args, "sid_softmax", False)
        problem = None if requested is False else self._sid_softmax_problem()
        if problem is not None and requested:
            raise ValueError(
                f"sid_softmax=True needs {problem}; set sid_softmax=False (--sid_softmax false)."
            )
        if problem is not None:
            logger.info("sid_softmax: the full head, since the SID-only softmax needs %s", problem)
        on = requested is not False and problem is None
        if requested is None:
            self.args.sid_softmax = on
        self.record_sid_softmax(on)
        return on

    def record_sid_softmax(self, on: bool) -> None:
        """Where a stage's adapter records its normalisation (the recommendation stage's does)."""

    def _sid_softmax_problem(self) -> str | None:
        """What the SID-only softmax needs that this trainer lacks (None: it applies)."""
        from ..sid_head import causal_lm, supports_compact_head

        problem = None
        if not hasattr(getattr(self.model, "base_model", None), "grounded_token_ids"):
            problem = f"a model with a grounded-token adapter, not a {type(self.model).__name__}"
        elif self.args.n_gpu > 1:
            problem = "one process per device (DDP through accelerate launch or torchrun, not DataParallel)"
        elif not supports_compact_head(causal_lm(self.model)):
            problem = "a head without logit soft-capping or scaling"
        elif self.args.label_smoothing_factor > 0 or self.compute_loss_func is not None:
            problem = "TRL's fused loss (no label_smoothing_factor, no compute_loss_func)"
        elif getattr(self, "aux_loss_enabled", False):
            problem = "a model without a MoE router loss"
        elif self.is_deepspeed_enabled or self.is_fsdp_enabled:
            # it reads the head's SID rows outside the head's forward, where ZeRO-3 and FSDP hold only shards
            problem = "unsharded training (not DeepSpeed or FSDP; DDP is fine)"
        return problem

    def build_manifest(self, data_fingerprint: str) -> dict:
        from ..sids.extended_base import sid_record

        a = self.args
        config = (
            self.model.peft_config[self.model.active_adapter].to_dict()
            if hasattr(self.model, "peft_config")
            else {}
        )
        config = {k: v for k, v in config.items() if k not in NOT_IN_MANIFEST}
        record = sid_record(self.model)
        if record:  # the SID index, prompt format and softmax the adapter trains for define the run too
            config["sid_record"] = record
        return {
            "stage": self.stage,
            "base_model": config.get("base_model_name_or_path"),
            "adapter": runs.fingerprint(config),
            "dataset": data_fingerprint,
            "learning_rate": a.learning_rate,
            "lr_scheduler_type": str(getattr(a.lr_scheduler_type, "value", a.lr_scheduler_type)),
            "max_steps": a.max_steps,
            "num_train_epochs": a.num_train_epochs,
            "per_device_train_batch_size": a.per_device_train_batch_size,
            "gradient_accumulation_steps": a.gradient_accumulation_steps,
            "world_size": a.world_size,
            "seed": a.seed,
            "max_length": a.max_length,
            "max_minutes": getattr(a, "max_minutes", None),
        }

    def _check_truncation(self, raw) -> None:
        """Refuse (or, with ``allow_truncation``, report) rows that TRL cut at ``max_length`` or dropped.

        TRL truncates during preparation and drops rows left without a label; a row that reaches
        ``max_length`` tokens after preparation may have been cut, so it counts too."""
        limit, prepared = self.args.max_length, self.train_dataset
        if limit is None or raw is None or not hasattr(raw, "__len__") or not hasattr(prepared, "__len__"):
            return
        if self.args.padding_free and not self.args.packing:  # nothing is cut: longer rows are refused
            longer = sum(1 for ids in prepared["input_ids"] if len(ids) > limit)
            if longer:
                raise ValueError(
                    f"{longer} of {len(raw)} training rows are longer than max_length={limit} tokens, and "
                    "padding-free batches (padding_free) cut no row: raise max_length (--max-length), show fewer "
                    "history items (max_history / --max-history), or train with padding_free=False"
                )
            return
        dropped = len(raw) - len(prepared)
        at_limit = sum(1 for ids in prepared["input_ids"] if len(ids) >= limit)
        if not (dropped or at_limit):
            return
        message = (
            f"{at_limit + dropped} of {len(raw)} training rows reach max_length={limit} tokens ({dropped} dropped "
            "whole by TRL, the rest cut at the limit): a cut SID trains on garbage. Raise max_length (--max-length), "
            "or show fewer history items (max_history / --max-history) or no titles"
        )
        if not getattr(self.args, "allow_truncation", False):
            raise ValueError(message + "; allow_truncation=True trains on them anyway.")
        warnings.warn(message + ".", stacklevel=3)

    def _flush_counts(self) -> None:
        """Move the targets counted on the device (summed over ranks) into the clock and the log window;
        every rank calls it at the same points (loss logs, evaluations, saves)."""
        pending = self._pending.to(self.args.device)
        if self.args.world_size > 1:
            pending = self.accelerator.reduce(pending, "sum")
        tokens, items = (int(v) for v in pending.tolist())
        self._pending = torch.zeros_like(self._pending)
        self._since_log = [self._since_log[0] + tokens, self._since_log[1] + items]
        self.clock.items += items

    def create_optimizer(self, model=None):
        """The optimizer; under FSDP2 the grounded layers are first sharded as one unit (accelerate shards
        the rest when it prepares the model, right after: see :mod:`peft_grounded.adapter.sharding`)."""
        plugin = self.accelerator.state.fsdp_plugin if self.is_fsdp_enabled else None
        if getattr(plugin, "fsdp_version", 1) == 2:
            from ..adapter.sharding import fsdp_mesh, shard_grounded_layers

            shard_grounded_layers(self.model if model is None else model, plugin, fsdp_mesh(self.accelerator))
        return super().create_optimizer(model)

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        """The configured schedule, or with ``max_minutes`` a schedule over the time budget
        (:func:`~peft_grounded.training.callbacks.time_schedule`)."""
        if getattr(self.args, "max_minutes", None) is None or self.lr_scheduler is not None:
            return super().create_scheduler(num_training_steps, optimizer)
        warmup = float(self.args.warmup_ratio or 0.0)
        self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer or self.optimizer, partial(_time_factor, self.clock, warmup)
        )
        return self.lr_scheduler

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Add ``seconds``, ``items_seen`` and the window's ``item_nll`` to each training-loss log.

        ``item_nll`` = the window's mean per-token loss x its SID tokens per target: in the first epoch the
        progressive loss (targets not trained on yet), in nats per item."""
        if "loss" in logs:
            self._flush_counts()
            tokens, items = self._since_log
            self._since_log = [0, 0]
            logs = {**logs, "seconds": round(self.clock.elapsed(), 3), "items_seen": self.clock.items}
            if items:
                logs["item_nll"] = logs["loss"] * tokens / items
        super().log(logs, start_time)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """TRL's loss, with the fused head scoring only the labelled positions on every device (and with
        ``sid_softmax``, each SID target normalised over the SID rows only).

        PEFT's own trainable tokens on a tied head wrap ``lm_head`` in a ``TrainableTokensWrapper``, which
        TRL 1.16's fused head cannot read (it has no ``bias``: ``AttributeError``): such a model (the
        baseline of :mod:`peft_grounded.evaluation.peers`) takes the model's own loss, the same masked
        next-token NLL through the full head."""
        labels = inputs.get("labels")
        if labels is not None and model.training:
            self._pending = self._pending.to(labels.device) + count_targets(labels)
        if _head_wrapped_by_peft(model):
            from transformers import Trainer

            keep = (
                "input_ids",
                "attention_mask",
                "position_ids",
                "labels",
            )  # position_ids: padding-free rows
            inputs = {k: v for k, v in inputs.items() if k in keep}
            return Trainer.compute_loss(
                self, model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
            )
        if not (self._compact_loss or self._sid_softmax):
            return super().compute_loss(
                model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
            )
        from ..sid_head import compact_head

        sid = {}
        if self._sid_softmax:
            sid["sid_ids"] = self._sid_ids(model)
            sid["sid_temperature"] = getattr(self.args, "sid_softmax_temperature", 1.0)
            sid["sid_targets"] = inputs.pop("sid_targets", None)
        with compact_head(model, **sid):
            return super().compute_loss(
                model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
            )

    def _sid_ids(self, model) -> torch.Tensor:
        """The SID rows of ``model``'s active grounded adapters (the SID-only softmax's columns)."""
        from ..sid_head import causal_lm

        wrapped = getattr(model, "module", model)
        tuner = getattr(wrapped, "base_model", None)
        if not hasattr(tuner, "grounded_token_ids"):
            raise ValueError(
                f"the SID-only softmax needs a grounded-token adapter; {causal_lm(model)!r} has none"
            )
        return tuner.grounded_token_ids()

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs):
        """Train; ``resume_from_checkpoint=True`` continues from the last complete checkpoint, starts afresh
        if the run was interrupted before its first one, and does nothing (saying so) for a finished run
        (default: the config's ``resume_from_checkpoint``)."""
        output_dir = Path(self.args.output_dir)
        if resume_from_checkpoint is None:
            resume_from_checkpoint = getattr(self.args, "resume", None)
        with output_lock(output_dir, f"{self.stage} training"), training_kernels(self.model, self.args):
            return self._train_locked(output_dir, resume_from_checkpoint, **kwargs)

    def _train_locked(self, output_dir: Path, resume_from_checkpoint: str | bool | None, **kwargs):
        main = self.is_world_process_zero()
        if main and output_dir.is_dir():
            removed = remove_leftovers(output_dir)
            if removed:
                logger.warning("%s: removed what a killed run left: %s", output_dir, ", ".join(removed))
        if resume_from_checkpoint is True and (output_dir / runs.MANIFEST).is_file():
            # a resume reads the manifest: an unreadable one is refused before anything is moved aside
            read_json(
                output_dir / runs.MANIFEST, fix="move it away, or start the run in a new output directory"
            )
        if resume_from_checkpoint is True:
            if self._finished(output_dir):
                return self._already_finished(output_dir)
            resume_from_checkpoint = self._last_complete(output_dir, move_aside=main)
        # every rank checks (a refusal on the main process alone would leave the others hanging in DDP's
        # first collective); only the main one writes
        runs.check_run(output_dir, self.manifest, resume_from_checkpoint)
        if resume_from_checkpoint is None and (output_dir / ADAPTER_DIR).exists():
            raise runs.RunMismatchError(
                f"{output_dir} already holds a finished run's adapter ({output_dir / ADAPTER_DIR}); training "
                "again would replace it and its run.json. Resume it (a no-op: --resume_from_checkpoint), choose another "
                "output directory, or delete that adapter first."
            )
        if resume_from_checkpoint is None:
            check_own_file(output_dir / runs.MANIFEST, dict, "run manifest")
            check_own_file(output_dir / LOG_FILE, list, "loss log")
        if main:
            runs.write_json_atomic(output_dir / runs.MANIFEST, self.manifest)
        saved_state = checkpoint_state(resume_from_checkpoint)
        if saved_state is not None and stopped(saved_state):
            # killed after its last checkpoint, before its adapter: finish from that checkpoint (training on
            # would add a step an uninterrupted run never took)
            logger.warning(
                "%s ended training at step %d; writing its adapter from that checkpoint (no further step)",
                resume_from_checkpoint,
                saved_state.global_step,
            )
            load_adapter_weights(self.model, resume_from_checkpoint)
            self.state = saved_state
            for callback in self.callback_handler.callbacks:  # e.g. keep_best: its best adapter, not the last
                finish = getattr(callback, "finish_stopped_run", None)
                if finish is not None:
                    finish(self.args, self.state, self.model, processing_class=self.processing_class)
            result = TrainOutput(saved_state.global_step, train_loss(saved_state), {})
        else:
            result = super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)
        # accelerate leaves the forward wrapped in its mixed-precision autocast: unwrap it, so that what
        # follows (evaluation, merging) runs at the precision the caller asks for, resumed or not
        extract_model_from_parallel(self.model, keep_fp32_wrapper=False)
        try:
            if main:
                runs.write_json_atomic(output_dir / LOG_FILE, self.state.log_history)
            self._save_final_adapter(output_dir / ADAPTER_DIR)
        except Exception as err:
            if not is_disk_full(err):
                raise
            raise DiskFullError(
                f"the run in {output_dir} finished training, but the disk filled while writing its loss log or "
                f"adapter ({err}). Its last checkpoint holds the trained state: free disk space, then resume "
                "(--resume_from_checkpoint / resume_from_checkpoint=True) to write them without training again.",
                err,
            ) from err
        return result

    def _save_final_adapter(self, directory: Path) -> None:
        """The trained adapter, written atomically; sharded (FSDP, DeepSpeed) states are gathered first."""
        if not (self.is_fsdp_enabled or self.is_deepspeed_enabled):
            if self.is_world_process_zero():
                save_adapter_atomic(self.model, directory)
            return
        from ..adapter.sharding import gathered_trainable_state

        model = self.accelerator.unwrap_model(self.model)
        state = gathered_trainable_state(
            model, fsdp=self.is_fsdp_enabled, deepspeed=self.is_deepspeed_enabled
        )  # every rank takes part in gathering; the main one writes
        if self.is_world_process_zero():
            save_adapter_atomic(model, directory, state_dict=state)
        self.accelerator.wait_for_everyone()


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Torch's draws inside (on the CPU and every initialised GPU) follow ``seed``; the process's generators are
    as they were on leaving, so a caller's later draws do not depend on what ran inside."""
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    with torch.random.fork_rng(devices=list(range(torch.cuda.device_count())) if cuda else []):
        torch.random.default_generator.manual_seed(int(seed))
        if cuda:  # seeded now, not lazily at a later initialisation (which would outlive the block)
            torch.cuda.manual_seed_all(int(seed))
        yield


@dataclass
class StageRun:
    """What a stage's entry point was asked for beside its settings: a live model (with its tokenizer) to train
    in place instead of loading one, the example cap, extra callbacks, and whether to resume."""

    model: Any = None
    tokenizer: Any = None
    max_examples: int | None = None
    callbacks: list | None = None
    resume: bool = False


def run_stage(
    trainer_cls: type[RunTrainer],
    index,
    args,
    run: StageRun,
    dataset: Callable[[Any], Any],
    prepare: Callable[[Any], None] | None = None,
    *,
    caller: str,
    model_path: str | None = None,
    start: RowStart | None = None,
    fmt: PromptFormat | None = None,
    adapter: str | None = None,
    dtype: torch.dtype = torch.float32,
):
    """The body of a stage's entry point (``ground``, ``train_recommender``): check ``run.max_examples``, take
    ``run.model`` or load one for ``index`` (:func:`~peft_grounded.sids.extended_base.model_for`: ``model_path`` in
    ``dtype``, its rows started as ``start`` says or loaded from ``adapter``, ``fmt`` recorded, the run's seed),
    ``prepare`` it, then train a ``trainer_cls`` built from ``args`` on ``dataset(tokenizer)``, from the run's
    last checkpoint when ``run.resume``. Returns the model. Every random start follows ``args.seed``: the model
    and what ``prepare`` adds (a stacked LoRA) are drawn under :func:`seeded`, the Trainer seeds data order,
    dropout and NEFTune's noise, the dataset its augmentation and teacher."""
    from ..sids.extended_base import model_for

    check_max_examples(run.max_examples)
    with seeded(args.seed):  # the model is built (a LoRA drawn) before the Trainer seeds the process
        tokenizer, model = model_for(
            index,
            run.model,
            run.tokenizer,
            model_path=model_path,
            caller=caller,
            start=start,
            seed=args.seed,
            fmt=fmt,
            adapter=adapter,
            dtype=dtype,
        )
        if prepare is not None:
            prepare(model)
    trainer = trainer_cls(
        model,
        args,
        train_dataset=dataset(tokenizer),
        max_examples=run.max_examples,
        processing_class=tokenizer,
        callbacks=run.callbacks,
    )
    trainer.train(resume_from_checkpoint=True if run.resume else None)
    return model


def _refuse_cloned_chat_template(args) -> None:
    """TRL's ``chat_template_path`` naming a tokenizer adds its tokens by resizing the model, which a grounded
    adapter cannot follow (docs/peft_trl_limitations.md): refuse it with the workaround, before any work."""
    path = getattr(args, "chat_template_path", None)
    if path is None or str(path).endswith((".jinja", ".j2")):
        return
    raise ValueError(
        f"chat_template_path={path!r} names a tokenizer: TRL would copy its chat template and add its special "
        "tokens by resizing the model, which the grounded-token adapter already wraps (and PEFT's "
        "trainable_token_indices, which TRL sets for them, does not exist on GroundedTokenConfig). Pass the "
        "template as a .jinja file instead (it adds no tokens), or set tokenizer.chat_template yourself and add "
        "the template's new tokens together with the SID tokens (peft_grounded.add_tokens) before wrapping the "
        "model, so that their rows train with the SIDs. See docs/peft_trl_limitations.md."
    )
