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

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from peft import PeftModel, get_peft_model

from .._io import locks_output
from .._quiet import peft_wrapping
from ..adapter import GroundedTokenConfig
from ..prompts import DEFAULT_SYSTEM_PROMPT
from ..sids.catalogue_source import index_catalogue
from ..sids.extended_base import RowStart
from .stage_config import GroundingConfig
from .trainer import RunTrainer, StageRun, run_stage


def _refuse_lora(config: GroundedTokenConfig) -> None:
    if config.has_lora:
        raise ValueError(
            "Grounding trains the new token rows with the backbone frozen; this adapter carries a LoRA. "
            "Ground first, then stack the LoRA with peft_grounded.add_lora for the task's SFT."
        )


def _trainable_names(model) -> list[str]:
    return [n for n, p in model.named_parameters() if p.requires_grad]


class GroundingTrainer(RunTrainer):
    """``SFTTrainer`` for the grounding stage: only the grounded rows train; resumable and run-checked.

    ``rows``: train only these rows of the grounded matrices (incremental grounding of a grown adapter,
    :func:`peft_grounded.new_items.ground_new_items`): a gradient mask keeps every other row bit-identical, which
    needs ``weight_decay=0``; a stacked LoRA is then allowed as long as it is frozen.
    """

    stage = "grounding"

    def __init__(
        self,
        model,
        args: GroundingConfig | None = None,
        *,
        peft_config: GroundedTokenConfig | None = None,
        rows: Sequence[int] | None = None,
        **kwargs,
    ) -> None:
        if peft_config is not None:
            _refuse_lora(peft_config)
            if isinstance(model, PeftModel):
                raise ValueError("Pass either a PeftModel or a peft_config, not both.")
            if not isinstance(peft_config, GroundedTokenConfig):
                raise TypeError("GroundingTrainer's peft_config must be a GroundedTokenConfig.")
            with peft_wrapping():
                model = get_peft_model(model, peft_config)
        if not isinstance(model, PeftModel) or not any(
            isinstance(c, GroundedTokenConfig) for c in model.peft_config.values()
        ):
            raise ValueError(
                "GroundingTrainer needs a model with a grounded-token adapter (or pass peft_config)."
            )
        if rows is None:
            _refuse_lora(model.peft_config[model.active_adapter])
        others = [n for n in _trainable_names(model) if ".grounded_" not in n]
        if others:
            raise ValueError(
                f"Only the new token rows may train during grounding; also trainable: {others[:5]}."
            )
        if not _trainable_names(model):
            raise ValueError("No grounded rows are trainable: load the adapter with is_trainable=True.")
        args = args or GroundingConfig(output_dir="grounding")
        if rows is not None and args.weight_decay:
            raise ValueError(
                f"training only some rows needs weight_decay=0 (decay would move the others), got {args.weight_decay}"
            )
        self.rows = None if rows is None else list(rows)
        super().__init__(model, args, **kwargs)

    def train(self, *args, **kwargs):
        """Train (see :meth:`RunTrainer.train`); with ``rows``, the other rows' gradients are zeroed meanwhile."""
        if self.rows is None:
            return super().train(*args, **kwargs)
        with rows_only(self.model, self.rows):
            return super().train(*args, **kwargs)


@contextlib.contextmanager
def rows_only(model, rows: Sequence[int]) -> Iterator[None]:
    """Within: the gradients of the trainable grounded matrices zeroed outside ``rows``, so that (with
    ``weight_decay=0``) every other row stays bit-identical whatever trainer runs."""
    handles = []
    for name, param in model.named_parameters():
        if param.requires_grad and ".grounded_" in name:
            mask = torch.zeros(param.shape[0], 1, dtype=torch.bool, device=param.device)
            mask[torch.as_tensor(list(rows), device=param.device)] = True
            handles.append(param.register_hook(partial(_keep_rows, mask)))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _keep_rows(mask: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """``grad`` with the rows outside ``mask`` zeroed."""
    return grad * mask.to(grad.device, grad.dtype)


@locks_output("args.output_dir", "ground")
def ground(
    catalogue,
    index,
    args: GroundingConfig,
    *,
    model_path: str | None = None,
    start: RowStart | None = None,
    max_examples: int | None = None,
    resume: bool = False,
    model: PeftModel | None = None,
    tokenizer=None,
    dtype: torch.dtype = torch.float32,
    callbacks: list | None = None,
) -> PeftModel:
    """Ground the adapter for ``index``'s tokens on ``catalogue``'s text (the ``ground`` command; ``catalogue``
    None: the one the index was built from, see :func:`~peft_grounded.sids.catalogue_source.index_catalogue`).

    A fresh base model (``model_path``, default: the packaged SmolLM2-135M, loaded in ``dtype``) gets the tokens
    and ``start`` (a :class:`~peft_grounded.sids.extended_base.RowStart`; None: its defaults) starts their rows; or
    ``model`` (with its ``tokenizer``), a model already wrapped for ``index``, is grounded in place (the
    strategy runner's path). Only the rows train, on the six GTI templates; the adapter lands in
    ``<args.output_dir>/adapter``. The output folder is locked from the start, before the model is loaded.
    """

    catalogue = index_catalogue(index, catalogue, flag="catalogue=")
    run = StageRun(model, tokenizer, max_examples, callbacks, resume)
    data = partial(grounding_dataset, catalogue, index)
    return run_stage(
        GroundingTrainer,
        index,
        args,
        run,
        data,
        caller="ground",
        model_path=model_path,
        start=start,
        dtype=dtype,
    )


# Grounding data: paired text <-> SID examples for every item, in TRL's prompt-completion format.
#
# Six templates per item, adapted from LC-Rec as in the GTI paper: title -> SID, description -> SID,
# title + description -> SID, and the three reverses. With a chat template the examples are conversations
# (system, user | assistant), otherwise plain prompts; the loss is on the completion only.


@dataclass(frozen=True)
class GroundingTemplate:
    """One direction of grounding: ``prompt`` and ``completion`` over ``{title}``, ``{description}``, ``{sid}``."""

    name: str
    prompt: str
    completion: str

    @property
    def fields(self) -> set[str]:
        return {f for f in ("title", "description") if f"{{{f}}}" in self.prompt + self.completion}


DEFAULT_TEMPLATES = (
    GroundingTemplate("title_to_sid", 'Which item is called "{title}"?', "{sid}"),
    GroundingTemplate("description_to_sid", "Which item is described as: {description}", "{sid}"),
    GroundingTemplate(
        "title_description_to_sid", 'What item is called "{title}" and described as: {description}', "{sid}"
    ),
    GroundingTemplate("sid_to_title", "What is the title of item {sid}?", "{title}"),
    GroundingTemplate("sid_to_description", "Describe item {sid}.", "{description}"),
    GroundingTemplate(
        "sid_to_title_description",
        "What is item {sid}? Give its title and a description.",
        "{title}: {description}",
    ),
)


@dataclass
class GroundingData:
    """How item text fills the templates."""

    templates: tuple[GroundingTemplate, ...] = DEFAULT_TEMPLATES
    description_fields: tuple[str, ...] = ("description",)
    fallback_description_fields: tuple[str, ...] = ("categories", "brand", "release_year")
    max_description_chars: int = 300
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT
    skipped: dict[str, int] = field(default_factory=dict)

    def description(self, item: Any) -> str:
        """The item's description; items without one are described by their other fields (e.g. genres)."""
        for fields in (self.description_fields, self.fallback_description_fields):
            parts = []
            for name in fields:
                text = item.field_text(name).strip()
                if text:
                    label = (
                        ""
                        if fields is self.description_fields
                        else f"{name.replace('_', ' ').capitalize()}: "
                    )
                    parts.append(label + text)
            if parts:
                text = "; ".join(parts)
                return (
                    text
                    if len(text) <= self.max_description_chars
                    else text[: self.max_description_chars] + "..."
                )
        return ""


def _message(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


def grounding_examples(catalogue, index, data: GroundingData | None = None, chat: bool = True) -> list[dict]:
    """Rows ``{"item_id", "template", "prompt", "completion"}`` for every item of ``index`` in ``catalogue``.

    Items or templates whose text is missing are skipped and counted in ``data.skipped``.
    """
    data = data or GroundingData()
    data.skipped.clear()
    rows = []
    for item_id in index.item_ids:
        item = catalogue.items.get(item_id)
        if item is None:
            data.skipped["item not in catalogue"] = data.skipped.get("item not in catalogue", 0) + 1
            continue
        values = {
            "title": item.title.strip(),
            "description": data.description(item),
            "sid": index.sid_text(item_id),
        }
        for template in data.templates:
            if any(not values[f] for f in template.fields):
                key = (
                    f"{template.name}: empty {'/'.join(sorted(f for f in template.fields if not values[f]))}"
                )
                data.skipped[key] = data.skipped.get(key, 0) + 1
                continue
            prompt, completion = template.prompt.format(**values), template.completion.format(**values)
            if chat:
                messages = [_message("system", data.system_prompt)] if data.system_prompt else []
                row_prompt: Any = [*messages, _message("user", prompt)]
                row_completion: Any = [_message("assistant", completion)]
            else:
                # a SID follows "Answer:" directly (as in the recommendation prompts); text after a space
                sep = "" if template.completion == "{sid}" else " "
                row_prompt, row_completion = f"{prompt}\nAnswer:", f"{sep}{completion}"
            rows.append(
                {
                    "item_id": item_id,
                    "template": template.name,
                    "prompt": row_prompt,
                    "completion": row_completion,
                }
            )
    if not rows:
        raise ValueError(
            "No grounding example could be made: the index's items have no title or description text."
        )
    return rows


def grounding_dataset(
    catalogue, index, tokenizer=None, data: GroundingData | None = None, chat: bool | None = None
):
    """A shuffled-later ``datasets.Dataset`` of grounding pairs; chat format when ``tokenizer`` has a template."""
    from datasets import Dataset

    if chat is None:
        chat = tokenizer is not None and getattr(tokenizer, "chat_template", None) is not None
    return Dataset.from_list(grounding_examples(catalogue, index, data, chat=chat))


def templates_by_name(names: Iterable[str]) -> tuple[GroundingTemplate, ...]:
    """A subset of the default templates, by name."""
    known = {t.name: t for t in DEFAULT_TEMPLATES}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"Unknown grounding templates {unknown}; choose from {sorted(known)}.")
    return tuple(known[n] for n in names)
