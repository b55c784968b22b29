"""The part every stage's trainer shares: an ``SFTTrainer`` that knows its run.

:class:`RunTrainer` records a run manifest (see :mod:`peft_grounded.training.runs`), copies it into every checkpoint,
refuses to resume from or write next to another run's checkpoints (or a finished run's adapter), keeps the
loss log as JSON and writes the final adapter atomically to ``<output_dir>/adapter``. It also

* trains every adapter weight in float32 (master weights), whatever the base's dtype;
* refuses rows that ``max_length`` would cut (TRL truncates silently, and a cut SID trains on garbage);
* keeps a :class:`~peft_grounded.training.clock.TrainingClock`: each loss log gets ``seconds`` (training
  time) and ``items_seen`` (item targets so far, a target = one labelled SID), and ``max_minutes`` stops
  the run at a training time with a learning rate that decays linearly to 0 at that time.
"""

from __future__ import annotations

import logging
import shutil
import warnings
from functools import partial
from pathlib import Path

import torch
from accelerate.utils import extract_model_from_parallel
from peft import PeftModel, PeftModelForCausalLM
from transformers import TrainerCallback
from transformers.trainer_callback import ProgressCallback
from transformers.trainer_utils import get_last_checkpoint
from trl import SFTTrainer

from .._io import make_temp_dir
from . import runs
from .clock import TimeProgressCallback, TrainingClock, time_schedule
from .config import check_max_examples
from .runs import ADAPTER_DIR, LOG_FILE

logger = logging.getLogger(__name__)


def sample_rows(dataset, n: int | None, seed: int):
    """A seeded sample of ``n`` rows (all rows when ``n`` is None or larger than the dataset)."""
    check_max_examples(n)
    if n is None or n >= len(dataset):
        return dataset
    return dataset.shuffle(seed=seed).select(range(n))


def dataset_fingerprint(dataset) -> str:
    """A content hash of the rows, the same in every process and ``datasets`` version (large datasets fall
    back to ``datasets``' own fingerprint)."""
    if dataset is None:
        return "none"
    if len(dataset) <= 200_000:
        return runs.fingerprint(dataset.to_list())
    return str(getattr(dataset, "_fingerprint", len(dataset)))


def save_adapter_atomic(model: PeftModel, directory: str | Path, state_dict: dict | None = None) -> Path:
    """``model.save_pretrained(directory)`` through a temporary sibling directory, swapped in at the end
    (``state_dict``: the weights to take them from, e.g. gathered from shards)."""
    directory = Path(directory)
    tmp = make_temp_dir(directory)
    try:
        model.save_pretrained(tmp, **({} if state_dict is None else {"state_dict": state_dict}))
        _swap_into_place(tmp, directory)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return directory


def _swap_into_place(new: Path, directory: Path) -> None:
    """Replace ``directory`` by the finished ``new`` one (the old copy survives as ``.<name>.old`` until then)."""
    old = directory.with_name(f".{directory.name}.old")
    if directory.exists():
        shutil.rmtree(old, ignore_errors=True)
        directory.rename(old)
    new.rename(directory)
    shutil.rmtree(old, ignore_errors=True)


UNLIMITED_STEPS = 10**9  # max_steps when only a time budget ends the run


def _time_factor(clock: TrainingClock, warmup_ratio: float, _step: int) -> float:
    return time_schedule(clock.fraction(), warmup_ratio)


def count_targets(labels: torch.Tensor) -> torch.Tensor:
    """``[labelled tokens, item targets]`` of a batch (a target = a run of labelled tokens: one SID)."""
    labelled = labels != -100
    starts = labelled.clone()
    starts[:, 1:] &= ~labelled[:, :-1]
    return torch.stack([labelled.sum(), starts.sum()])


def upcast_trainable(model) -> list[str]:
    """Cast every trainable half-precision parameter to float32 in place (master weights: bf16/fp16 updates
    of small adapter weights round away); returns their names. PEFT's layers cast their inputs to the
    adapter's dtype and the result back, so a half-precision base keeps running in its dtype."""
    cast = []
    for name, param in model.named_parameters():
        if param.requires_grad and param.dtype in (torch.float16, torch.bfloat16):
            param.data = param.data.float()
            cast.append(name)
    if cast:
        logger.info(
            "trainable weights cast to float32 (master weights): %d tensors, e.g. %s", len(cast), cast[0]
        )
    return cast


def _head_wrapped_by_peft(model) -> bool:
    """Whether PEFT's ``TrainableTokensWrapper`` replaced the output embedding (trainable tokens, tied head)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return type(head).__name__ == "TrainableTokensWrapper"


class _CopyManifest(TrainerCallback):
    """Store the run manifest in every checkpoint so a resume can be checked against it."""

    def __init__(self, manifest: dict) -> None:
        self.manifest = manifest

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if checkpoint.is_dir():
                runs.write_json_atomic(checkpoint / runs.MANIFEST, self.manifest)
        return control


class RunTrainer(SFTTrainer):
    """``SFTTrainer`` with a run manifest, checked resumes, a JSON loss log and an atomic final adapter."""

    stage = "sft"

    def __init__(self, model, args=None, **kwargs) -> None:
        train_dataset = kwargs.get("train_dataset")
        data = dataset_fingerprint(train_dataset)
        upcast_trainable(model)
        if args is not None and getattr(args, "max_minutes", None) is not None and args.max_steps <= 0:
            args.max_steps = UNLIMITED_STEPS
        super().__init__(model=model, args=args, **kwargs)
        self._check_truncation(train_dataset)
        self.manifest = self.build_manifest(data)
        self.add_callback(_CopyManifest(self.manifest))
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
        # The flag reaches GroundedTokenModel.forward only through PeftModelForCausalLM: a plain PeftModel
        # (no task_type) calls the transformers model directly, which would ignore it.
        self._compact_loss = getattr(self.args, "compact_loss", False) and isinstance(
            self.model, PeftModelForCausalLM
        )
        if getattr(self.args, "compact_loss", False) and not self._compact_loss:
            warnings.warn(
                "compact_loss=True needs a model wrapped with task_type='CAUSAL_LM' (a PeftModelForCausalLM); "
                f"this is a {type(self.model).__name__}, so TRL's full-vocabulary head is used for every position "
                "(same result, slower). Pass task_type='CAUSAL_LM' to GroundedTokenConfig.",
                stacklevel=2,
            )

    def build_manifest(self, data_fingerprint: str) -> dict:
        a = self.args
        config = (
            self.model.peft_config[self.model.active_adapter].to_dict()
            if hasattr(self.model, "peft_config")
            else {}
        )
        return {
            "stage": self.stage,
            "base_model": config.get("base_model_name_or_path"),
            "adapter": runs.fingerprint(
                {k: v for k, v in config.items() if k not in ("inference_mode", "peft_version")}
            ),
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
        (:func:`~peft_grounded.training.clock.time_schedule`)."""
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
        """TRL's loss, with the fused head scoring only the labelled positions on every device.

        PEFT's own trainable tokens on a tied head wrap ``lm_head`` in a ``TrainableTokensWrapper``, which
        TRL 1.16's fused head cannot read (it has no ``bias``: ``AttributeError``): such a model (the
        baseline of :mod:`peft_grounded.peers.peft_default`) takes the model's own loss, the same masked
        next-token NLL through the full head."""
        labels = inputs.get("labels")
        if labels is not None and model.training:
            self._pending = self._pending.to(labels.device) + count_targets(labels)
        if _head_wrapped_by_peft(model):
            from transformers import Trainer

            inputs = {k: v for k, v in inputs.items() if k in ("input_ids", "attention_mask", "labels")}
            return Trainer.compute_loss(
                self, model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
            )
        if self._compact_loss:
            inputs = {**inputs, "compact_fused_lm_head": True}
        return super().compute_loss(
            model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
        )

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs):
        """Train; ``resume_from_checkpoint=True`` continues from the last checkpoint, or starts afresh if the
        run was interrupted before its first one (default: the config's ``resume_from_checkpoint``)."""
        output_dir = Path(self.args.output_dir)
        if resume_from_checkpoint is None:
            resume_from_checkpoint = getattr(self.args, "resume", None)
        if resume_from_checkpoint is True:
            last = get_last_checkpoint(str(output_dir)) if output_dir.is_dir() else None
            if last is None:
                logger.info("%s holds no checkpoint yet: starting the run from the beginning", output_dir)
            resume_from_checkpoint = last
        # every rank checks (a refusal on the main process alone would leave the others hanging in DDP's
        # first collective); only the main one writes
        runs.check_run(output_dir, self.manifest, resume_from_checkpoint)
        if resume_from_checkpoint is None and (output_dir / ADAPTER_DIR).exists():
            raise runs.RunMismatchError(
                f"{output_dir} already holds a finished run's adapter ({output_dir / ADAPTER_DIR}); training "
                "again would replace it and its run.json. Choose another output directory, or delete that "
                "adapter first."
            )
        if self.is_world_process_zero():
            runs.write_json_atomic(output_dir / runs.MANIFEST, self.manifest)
        result = super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)
        # accelerate leaves the forward wrapped in its mixed-precision autocast: unwrap it, so that what
        # follows (evaluation, merging) runs at the precision the caller asks for, resumed or not
        extract_model_from_parallel(self.model, keep_fp32_wrapper=False)
        if self.is_world_process_zero():
            runs.write_json_atomic(output_dir / LOG_FILE, self.state.log_history)
        self._save_final_adapter(output_dir / ADAPTER_DIR)
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
