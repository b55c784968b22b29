"""Grounding data: paired text <-> SID examples for every item, in TRL's prompt-completion format.

Six templates per item, adapted from LC-Rec as in the GTI paper: title -> SID, description -> SID,
title + description -> SID, and the three reverses. With a chat template the examples are conversations
(system, user | assistant), otherwise plain prompts; the loss is on the completion only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..prompts import DEFAULT_SYSTEM_PROMPT


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
