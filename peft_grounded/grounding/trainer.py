"""The grounding stage (GTI): train only the new token rows, backbone frozen, through TRL's ``SFTTrainer``.

``GroundingConfig`` / ``GroundingTrainer`` follow TRL's config/trainer pairs. The trainer is an
``SFTTrainer`` that

* wraps the model with a :class:`~peft_grounded.GroundedTokenConfig` when one is given (PEFT conventions);
* refuses anything trainable besides the grounded rows (a LoRA comes after grounding, see ``add_lora``);
* records a run manifest and refuses to resume from, or write next to, checkpoints of another run;
* writes the final adapter atomically and keeps the loss log as JSON.

Checkpoints hold only the new rows (``adapter_model.safetensors``), the optimiser, scheduler and RNG
states: ``train(resume_from_checkpoint=True)`` after a crash ends where an uninterrupted run ends.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from peft import PeftModel, get_peft_model
from transformers import TrainerCallback
from transformers.trainer_utils import get_last_checkpoint
from trl import SFTConfig, SFTTrainer

from .. import runs
from ..adapter import GroundedTokenConfig

ADAPTER_DIR = "adapter"
LOG_FILE = "log_history.json"


@dataclass
class GroundingConfig(SFTConfig):
    """``SFTConfig`` with the grounding stage's defaults.

    The GTI paper grounds with learning rate 1e-3 (only embedding rows move, so a large rate is safe) and
    computes the loss on the completion only.
    """

    learning_rate: float = field(default=1e-3, metadata={"help": "Learning rate of the new rows."})
    lr_scheduler_type: str = field(default="cosine", metadata={"help": "Learning-rate schedule."})
    warmup_ratio: float = field(default=0.03, metadata={"help": "Share of the steps spent warming up."})
    weight_decay: float = field(default=0.0, metadata={"help": "No decay: it would pull the rows to zero."})
    completion_only_loss: bool | None = field(default=True, metadata={"help": "Loss on the completion only."})
    save_total_limit: int | None = field(default=2, metadata={"help": "Checkpoints kept on disk."})
    report_to: Any = field(default="none", metadata={"help": "Logging integrations (none by default)."})


def _trainable_names(model) -> list[str]:
    return [n for n, p in model.named_parameters() if p.requires_grad]


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


class GroundingTrainer(SFTTrainer):
    """``SFTTrainer`` for the grounding stage: only the grounded rows train; resumable and run-checked."""

    def __init__(
        self,
        model,
        args: GroundingConfig | None = None,
        *,
        peft_config: GroundedTokenConfig | None = None,
        **kwargs,
    ) -> None:
        if peft_config is not None:
            if isinstance(model, PeftModel):
                raise ValueError("Pass either a PeftModel or a peft_config, not both.")
            if not isinstance(peft_config, GroundedTokenConfig):
                raise TypeError("GroundingTrainer's peft_config must be a GroundedTokenConfig.")
            model = get_peft_model(model, peft_config)
        if not isinstance(model, PeftModel) or not any(
            isinstance(c, GroundedTokenConfig) for c in model.peft_config.values()
        ):
            raise ValueError(
                "GroundingTrainer needs a model with a grounded-token adapter (or pass peft_config)."
            )
        config = model.peft_config[model.active_adapter]
        if config.has_lora:
            raise ValueError(
                "Grounding trains the new token rows with the backbone frozen; this adapter carries a LoRA. "
                "Ground first, then stack the LoRA with peft_grounded.add_lora for the task's SFT."
            )
        others = [n for n in _trainable_names(model) if ".grounded_" not in n]
        if others:
            raise ValueError(
                f"Only the new token rows may train during grounding; also trainable: {others[:5]}."
            )
        if not _trainable_names(model):
            raise ValueError("No grounded rows are trainable: load the adapter with is_trainable=True.")
        args = args or GroundingConfig(output_dir="grounding")
        data_fingerprint = dataset_fingerprint(kwargs.get("train_dataset"))
        super().__init__(model=model, args=args, **kwargs)
        self.manifest = self._manifest(config, data_fingerprint)
        self.add_callback(_CopyManifest(self.manifest))

    def _manifest(self, config: GroundedTokenConfig, data_fingerprint: str) -> dict:
        a = self.args
        adapter = config.to_dict()
        return {
            "stage": "grounding",
            "base_model": adapter.get("base_model_name_or_path"),
            "adapter": runs.fingerprint(
                {k: adapter[k] for k in sorted(adapter) if k not in ("inference_mode", "peft_version")}
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

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs):
        output_dir = Path(self.args.output_dir)
        if resume_from_checkpoint is True:
            last = get_last_checkpoint(str(output_dir)) if output_dir.is_dir() else None
            if last is None:
                raise FileNotFoundError(f"resume_from_checkpoint=True but {output_dir} holds no checkpoint.")
            resume_from_checkpoint = last
        if self.is_world_process_zero():
            runs.check_and_write(output_dir, self.manifest, resume_from_checkpoint)
        result = super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)
        if self.is_world_process_zero():
            runs.write_json_atomic(output_dir / LOG_FILE, self.state.log_history)
            save_adapter_atomic(self.model, output_dir / ADAPTER_DIR)
        return result


def dataset_fingerprint(dataset) -> str:
    """A content hash of a (raw, in-memory) dataset; ``datasets``' own fingerprint of one is random."""
    if dataset is None:
        return "none"
    if len(dataset) <= 200_000:
        return runs.fingerprint(dataset.to_list())
    return str(getattr(dataset, "_fingerprint", len(dataset)))


def save_adapter_atomic(model: PeftModel, directory: str | Path) -> Path:
    """``model.save_pretrained(directory)`` through a temporary sibling directory, swapped in at the end."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        model.save_pretrained(tmp)
        old = directory.with_name(f".{directory.name}.old")
        if directory.exists():
            shutil.rmtree(old, ignore_errors=True)
            directory.rename(old)
        tmp.rename(directory)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return directory
