"""Recommendation SFT: the LoRA-stacked grounded adapter learns next-item SIDs, through TRL's ``SFTTrainer``.

:func:`shallow_base` (below) writes the first decoder blocks of a causal LM as a model of its own, for runs
that trade depth for steps on a CPU.
"""

from __future__ import annotations

from dataclasses import asdict
from functools import partial
from pathlib import Path

import torch
from peft import PeftModel

from ..._io import locks_output, make_temp_dir
from ...adapter import GroundedTokenConfig
from ...prompts import PromptFormat
from ...sids.catalogue_source import index_catalogue
from ...sids.extended_base import SID_SOFTMAX_KEY, RowStart, record_sid_facts
from ..callbacks import ValidationRecall
from ..stage_config import RecommendationConfig
from ..trainer import RunTrainer, StageRun, run_stage

__all__ = [
    "RecommendationConfig",
    "RecommendationTrainer",
    "ValidationRecall",
    "shallow_base",
    "train_recommender",
]


class RecommendationTrainer(RunTrainer):
    """``SFTTrainer`` for next-item SFT on a grounded adapter (usually with a LoRA from ``add_lora``)."""

    stage = "recommendation"

    def __init__(self, model, args: RecommendationConfig | None = None, **kwargs) -> None:
        from ...sids.extended_base import is_peft_default

        grounded = isinstance(model, PeftModel) and isinstance(
            model.peft_config.get(model.active_adapter), GroundedTokenConfig
        )
        if not (grounded or is_peft_default(model)):
            raise ValueError(
                "RecommendationTrainer trains a grounded-token adapter: wrap the model with GroundedTokenConfig "
                "(and stack a LoRA with peft_grounded.add_lora) first. (A PEFT LoraConfig with "
                "trainable_token_indices, the baseline of peft_grounded.evaluation.peers, is accepted too.)"
            )
        args = args or RecommendationConfig(output_dir="recommendation")
        if not grounded:
            args.compact_loss = False  # the compact head is this package's; the baseline keeps TRL's
        self._distill = getattr(args, "distill_weight", 0.0) > 0
        if self._distill:
            _check_teacher_columns(kwargs.get("train_dataset"))
        super().__init__(model, args, **kwargs)
        if self._distill:
            self._start_distillation()

    def _grounded(self) -> bool:
        return isinstance(self.model.peft_config.get(self.model.active_adapter), GroundedTokenConfig)

    def _sid_softmax_problem(self) -> str | None:
        if not self._grounded():
            return "a grounded adapter's SID rows (this model carries PEFT's own LoRA with trainable_token_indices)"
        return super()._sid_softmax_problem()

    def record_sid_softmax(self, on: bool) -> None:
        if self._grounded():
            record_sid_softmax(self.model, on)

    # ------------------------------------------------------------------------------ distillation (issue 40)

    def _start_distillation(self) -> None:
        """Refuse distillation without the SID-only softmax; let the teacher's columns into the batches."""
        from .distillation import TeacherCollator

        if not self._sid_softmax:
            problem = self._sid_softmax_problem() or "sid_softmax on"
            raise ValueError(
                f"distill_weight={self.args.distill_weight} scores the teacher's soft targets with the SID-only "
                f"softmax (sid_softmax), which this run cannot use: it needs {problem}. Set distill_weight=0."
            )
        sid_ids = self.model.base_model.grounded_token_ids().tolist()
        self.data_collator = TeacherCollator(self.data_collator, sid_ids, self.args.distill_top_k)

    def _set_signature_columns_if_needed(self) -> None:
        super()._set_signature_columns_if_needed()
        if self._distill:
            from .distillation import TEACHER_COLUMNS

            self._signature_columns = [*self._signature_columns, *TEACHER_COLUMNS]

    def build_manifest(self, data_fingerprint: str) -> dict:
        manifest = super().build_manifest(data_fingerprint)
        a = self.args
        manifest["distillation"] = (
            {
                "weight": a.distill_weight,
                "top_k": a.distill_top_k,
                "epochs": a.distill_epochs,
                "confident_share": a.distill_confident_share,
            }
            if self._distill
            else None
        )
        manifest["sid_softmax_temperature"] = getattr(a, "sid_softmax_temperature", 1.0)
        return manifest

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The loss of :class:`~peft_grounded.training.trainer.RunTrainer`; with ``distill_weight`` w > 0 and the
        teacher's columns in the batch, each SID target's term is ``(1 - w) * CE + w * softCE``: softCE =
        ``-sum_k q_k log p(id_k)`` against the teacher's ``q`` over its ``top_k`` ids, ``p`` the same SID-only
        softmax as the hard term's (a target left out by ``distill_confident_share`` has a one-hot ``q`` on its own
        code, so its softCE is its CE). Logs ``distill_loss`` (the mean softCE of the SID targets)."""
        from .distillation import TEACHER_COLUMNS

        teacher = [inputs.get(name) for name in TEACHER_COLUMNS]
        if teacher[0] is None:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        inputs = {k: v for k, v in inputs.items() if k not in TEACHER_COLUMNS}
        if not self._distill:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        hook = model.register_forward_hook(partial(self._distil, teacher[1]))
        try:
            inputs["sid_targets"] = teacher[0]
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        finally:
            hook.remove()

    def _distil(self, probs: torch.Tensor, _module, _args, output):
        """Forward hook: mix the soft cross-entropy into the per-token log-likelihoods TRL's loss sums."""
        from .distillation import soft_cross_entropy

        sid_log_probs = getattr(output, "sid_log_probs", None)
        if sid_log_probs is None:
            return None
        w = float(self.args.distill_weight)
        mask = output.sid_mask
        soft = soft_cross_entropy(probs.to(sid_log_probs.device), sid_log_probs)
        mixed = (1.0 - w) * output.log_probs[mask] - w * soft
        output.log_probs = output.log_probs.masked_scatter(mask, mixed)
        total = self.accelerator.gather_for_metrics(soft.detach().sum().reshape(1)).sum()
        count = self.accelerator.gather_for_metrics(torch.tensor([soft.numel()], device=soft.device)).sum()
        if count > 0:
            mode = "train" if self.model.training else "eval"
            self._metrics[mode]["distill_loss"].append((total / count).item())
        return output


def _check_teacher_columns(dataset) -> None:
    from .distillation import TEACHER_COLUMNS

    names = set(getattr(dataset, "column_names", None) or ())
    if not set(TEACHER_COLUMNS) <= names:
        raise ValueError(
            "distill_weight > 0 trains against the teacher's targets, and the training data has no "
            f"{' / '.join(TEACHER_COLUMNS)} columns: train through train_recommender (it fits the teacher), or "
            "add them with peft_grounded.training.sft.distillation.add_teacher_columns"
        )


def record_sid_softmax(model, on: bool) -> None:
    """Write the normalisation the adapter trains under into its SID record (``sid_softmax``: true for the
    SID-only softmax, false for the whole vocabulary)."""
    record_sid_facts(model, **{SID_SOFTMAX_KEY: bool(on)})


@locks_output("args.output_dir", "sft")
def train_recommender(
    catalogue,
    index,
    args: RecommendationConfig,
    *,
    model_path: str | None = None,
    grounded: str | None = None,
    start: RowStart | None = None,
    lora: dict | bool | None = None,
    fmt: PromptFormat | None = None,
    max_examples: int | None = None,
    resume: bool = False,
    model: PeftModel | None = None,
    tokenizer=None,
    split=None,
    callbacks: list | None = None,
    dtype: torch.dtype = torch.float32,
) -> PeftModel:
    """Next-item SFT with a LoRA stacked on the new rows (the ``sft`` command).

    The rows start from the grounded adapter at ``grounded`` (checked against ``index``) or as ``start`` says
    (a :class:`~peft_grounded.sids.extended_base.RowStart`; None: its defaults) on a fresh base (``model_path`` loaded
    in ``dtype``); or ``model`` (with its ``tokenizer``), a model already wrapped for ``index`` (the strategy
    runner's path), trains in place. ``lora`` holds
    :func:`~peft_grounded.add_lora`'s arguments (False: no LoRA; the rows, and any weight the caller made
    trainable, train); every adapter weight trains in float32. The rows follow
    ``fmt.objective`` (see :func:`~.data.training_dataset`) on ``split`` (default: the catalogue's
    leave-one-out split), and ``fmt`` is recorded in the adapter. Writes ``<args.output_dir>/adapter``
    (the folder is locked from the start, before the model is loaded). With ``args.distill_weight > 0`` a
    SASRec teacher is fitted on ``split`` first (or read back from ``<args.output_dir>/teacher``) and its soft
    targets join the rows (:mod:`.distillation`).
    """
    from ...adapter import add_lora
    from ...adapter.lora import lora_settings
    from .data import Augmentation, training_dataset

    catalogue = index_catalogue(index, catalogue, flag="catalogue=")  # None: the index's own
    stack = lora is not False  # False: no LoRA (the rows, and what the caller unfroze, train)
    lora_given = bool(lora)
    lora = lora_settings(**(lora or {}))  # checked before the model loads
    fmt = fmt or PromptFormat()
    split = split if split is not None else catalogue.leave_one_out()

    def stack_lora(model: PeftModel) -> None:
        config = model.peft_config[model.active_adapter]
        if isinstance(config, GroundedTokenConfig):
            record_sid_facts(model, prompt_format=asdict(fmt))
            if stack:
                add_lora(model, **lora)
        elif lora_given:
            raise ValueError(
                "lora= stacks a LoRA on a grounded adapter; this model carries PEFT's own LoRA already"
            )

    run = StageRun(model, tokenizer, max_examples, callbacks, resume)
    data = partial(training_dataset, split, index, catalogue, fmt=fmt, augment=Augmentation.of(args))
    if getattr(args, "distill_weight", 0.0) > 0:  # SASRec's soft targets beside the rows (.distillation)
        from .distillation import with_teacher

        data = partial(with_teacher, data, split, index, args, fmt=fmt, augment=Augmentation.of(args))
    return run_stage(
        RecommendationTrainer,
        index,
        args,
        run,
        data,
        stack_lora,
        caller="train_recommender",
        model_path=model_path,
        start=start,
        fmt=fmt,
        adapter=grounded,
        dtype=dtype,
    )


# A shallower base: the first ``layers`` decoder blocks of a causal LM, saved as a model of its own.
#
# Next-item SFT on a CPU is bound by the forward and backward passes through the frozen backbone; keeping
# the first blocks (with the embeddings, final norm and head) divides a step's time by about
# ``total / layers`` while the SID rows and the LoRA still start from the pretrained model. The result is a
# plain transformers checkpoint (safetensors), so every stage, saved adapter and Hub card records it as the
# base like any other model.


def shallow_base(model_path: str | Path, layers: int, output_dir: str | Path) -> Path:
    """Write (once; atomically) the first ``layers`` decoder blocks of ``model_path`` to ``output_dir``."""
    import shutil

    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(output_dir)
    if (out / "config.json").is_file():
        from transformers import AutoConfig

        have = AutoConfig.from_pretrained(out).get_text_config().num_hidden_layers
        if have != layers:
            raise ValueError(f"{out} holds a {have}-block base, not {layers}: choose another directory")
        return out
    model = AutoModelForCausalLM.from_pretrained(model_path, use_safetensors=True)
    config = model.config.get_text_config()
    if not 1 <= layers <= config.num_hidden_layers:
        raise ValueError(
            f"layers={layers}: the base has {config.num_hidden_layers} decoder blocks; keep 1 to all"
        )
    backbone = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    backbone.layers = backbone.layers[:layers]
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:layers]
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = make_temp_dir(out)
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
