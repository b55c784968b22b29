"""The part every stage's trainer shares: an ``SFTTrainer`` that knows its run.

:class:`RunTrainer` records a run manifest (see :mod:`peft_grounded.runs`), copies it into every checkpoint,
refuses to resume from or write next to another run's checkpoints, keeps the loss log as JSON and writes
the final adapter atomically to ``<output_dir>/adapter``.
"""

from __future__ import annotations

import logging
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accelerate.utils import extract_model_from_parallel
from peft import PeftModel, PeftModelForCausalLM
from transformers import TrainerCallback
from transformers.trainer_utils import get_last_checkpoint
from trl import SFTConfig, SFTTrainer

from . import runs
from ._io import make_temp_dir

logger = logging.getLogger(__name__)

ADAPTER_DIR = "adapter"
LOG_FILE = "log_history.json"


@dataclass
class RunConfig(SFTConfig):
    """``SFTConfig`` with the defaults every stage of this package shares."""

    lr_scheduler_type: str = field(default="cosine", metadata={"help": "Learning-rate schedule."})
    warmup_ratio: float = field(default=0.03, metadata={"help": "Share of the steps spent warming up."})
    completion_only_loss: bool | None = field(default=True, metadata={"help": "Loss on the completion only."})
    gradient_checkpointing: bool = field(
        default=False,
        metadata={"help": "Recompute activations in the backward pass (saves memory, costs time)."},
    )
    save_total_limit: int | None = field(default=2, metadata={"help": "Checkpoints kept on disk."})
    report_to: Any = field(default="none", metadata={"help": "Logging integrations (none by default)."})
    compact_loss: bool = field(
        default=True,
        metadata={
            "help": "Project only the labelled (completion) positions through the LM head, on every device; "
            "TRL does so on CUDA only (see peft_grounded.adapter.compact_head)."
        },
    )


def sample_rows(dataset, n: int | None, seed: int):
    """A seeded sample of ``n`` rows (all rows when ``n`` is None or larger than the dataset)."""
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


def save_adapter_atomic(model: PeftModel, directory: str | Path) -> Path:
    """``model.save_pretrained(directory)`` through a temporary sibling directory, swapped in at the end."""
    directory = Path(directory)
    tmp = make_temp_dir(directory)
    try:
        model.save_pretrained(tmp)
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
        data = dataset_fingerprint(kwargs.get("train_dataset"))
        super().__init__(model=model, args=args, **kwargs)
        self.manifest = self.build_manifest(data)
        self.add_callback(_CopyManifest(self.manifest))
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
        }

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """TRL's loss, with the fused head scoring only the labelled positions on every device."""
        if self._compact_loss:
            inputs = {**inputs, "compact_fused_lm_head": True}
        return super().compute_loss(
            model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
        )

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs):
        """Train; ``resume_from_checkpoint=True`` continues from the last checkpoint, or starts afresh if the
        run was interrupted before its first one."""
        output_dir = Path(self.args.output_dir)
        if resume_from_checkpoint is True:
            last = get_last_checkpoint(str(output_dir)) if output_dir.is_dir() else None
            if last is None:
                logger.info("%s holds no checkpoint yet: starting the run from the beginning", output_dir)
            resume_from_checkpoint = last
        # every rank checks (a refusal on the main process alone would leave the others hanging in DDP's
        # first collective); only the main one writes
        runs.check_run(output_dir, self.manifest, resume_from_checkpoint)
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
        staging = directory.with_name(f".{directory.name}.gathered")
        if self.is_world_process_zero():
            shutil.rmtree(staging, ignore_errors=True)
        self.accelerator.wait_for_everyone()
        self.save_model(str(staging))  # every rank takes part in gathering; the main one writes
        if self.is_world_process_zero():
            _swap_into_place(staging, directory)
        self.accelerator.wait_for_everyone()
