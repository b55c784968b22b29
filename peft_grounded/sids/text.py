"""The text an item is encoded from: a configurable, serialisable template over its fields."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from .catalogue import Item

DEFAULT_FIELDS = ("title", "brand", "categories", "description")


@dataclass(frozen=True)
class TextTemplate:
    """Renders an item as text from ``fields`` (standard fields or keys of ``item.extra``), skipping empty ones.

    ``labelled=True`` gives ``"Title: ...\\nBrand: ..."``; ``labelled=False`` joins the bare values. Each
    field is cut to ``max_chars`` characters (long descriptions would be truncated by the encoder anyway;
    cutting here keeps tokenisation cheap and the cache key stable).
    """

    fields: tuple[str, ...] = DEFAULT_FIELDS
    labelled: bool = True
    separator: str = "\n"
    max_chars: int = 1000
    category_separator: str = " > "

    def __post_init__(self) -> None:
        if not self.fields:
            raise ValueError("a text template needs at least one field, e.g. fields=('title',)")
        object.__setattr__(self, "fields", tuple(self.fields))

    def render(self, item: Item) -> str:
        parts = []
        for name in self.fields:
            value = item.field_text(name, self.category_separator)[: self.max_chars].strip()
            if value:
                parts.append(f"{name.replace('_', ' ').capitalize()}: {value}" if self.labelled else value)
        return self.separator.join(parts)

    def render_all(self, items: Sequence[Item]) -> list[str]:
        return [self.render(item) for item in items]

    def spec(self) -> dict[str, Any]:
        return asdict(self) | {"fields": list(self.fields)}

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any] | str | Sequence[str]) -> TextTemplate:
        """From :meth:`spec`'s dict, a comma-separated field list (``"title,brand"``) or a list of fields."""
        if isinstance(spec, str):
            return cls(fields=tuple(f.strip() for f in spec.split(",") if f.strip()))
        if isinstance(spec, Mapping):
            return cls(**{**spec, "fields": tuple(spec.get("fields", DEFAULT_FIELDS))})
        return cls(fields=tuple(spec))
