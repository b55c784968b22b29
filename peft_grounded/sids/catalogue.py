"""One representation of a recommendation catalogue, whatever file format it came from.

* :class:`Item`: an item's text (``title``, ``description``, ``brand``, ``categories`` as a path, and any
  ``extra`` string fields such as ``release_year`` or ``price``). Item ids are always strings.
* :class:`Catalogue`: the items (ordered, unique ids), each user's time-ordered item sequence, and a
  :class:`LoadReport` that counts what the loader skipped and why.
* :class:`LeaveOneOut`: the standard split (per user: the last item is the test target, the one before it
  the validation target, the rest the training history), training-target counts and cold items.

Consumers: grounding reads ``catalogue.items`` (text per item); recommendation SFT reads
``split.train_examples()`` / ``valid_examples()`` / ``test_examples()`` (or ``split.to_datasets()``);
evaluation reads ``split.cold_items(max_count)``; diagnostics read ``catalogue.category_labels(depth)`` and
``catalogue.item_counts()``.

:class:`TextTemplate` (below): the text an item is encoded from, a configurable, serialisable template over
its fields.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

TEXT_FIELDS = ("title", "description", "brand", "categories")


@dataclass(frozen=True, slots=True)
class Item:
    """One catalogue item. ``categories`` is a path, most general first (``("Office", "Pens")``)."""

    item_id: str
    title: str = ""
    description: str = ""
    brand: str = ""
    categories: tuple[str, ...] = ()
    extra: Mapping[str, str] = field(default_factory=dict)

    def field_text(self, name: str, category_separator: str = ", ") -> str:
        """The text of one field (a standard one or a key of ``extra``); ``""`` when absent."""
        if name == "categories":
            return category_separator.join(self.categories)
        if name in ("title", "description", "brand"):
            return getattr(self, name)
        if name == "item_id":
            return self.item_id
        return self.extra.get(name, "")

    def has_text(self) -> bool:
        """Whether any of title / description / brand / categories is non-empty."""
        return bool(self.title or self.description or self.brand or self.categories)


@dataclass
class LoadReport:
    """What a loader (or filter) read and what it skipped, with the reason; every skip is counted here."""

    source: str = ""
    items_read: int = 0
    items_without_text: int = 0
    duplicate_items: int = 0
    interactions_read: int = 0
    interactions_unknown_item: int = 0
    malformed_rows: int = 0
    notes: list[str] = field(default_factory=list)
    # the ids behind the counts, for callers that must refuse rather than drop (add_items)
    duplicate_item_ids: list[str] = field(default_factory=list)  # repeated ids (the first record was kept)
    conflicting_item_ids: list[str] = field(default_factory=list)  # repeated with another text
    no_text_item_ids: list[str] = field(default_factory=list)

    def summary(self) -> str:
        parts = [f"{self.items_read} items", f"{self.interactions_read} interactions read from {self.source}"]
        skips = {
            "items with no text in any field (dropped)": self.items_without_text,
            "duplicate item ids (first kept)": self.duplicate_items,
            "interactions naming items missing from the catalogue (dropped)": self.interactions_unknown_item,
            "malformed rows (dropped)": self.malformed_rows,
        }
        parts += [f"{n} {what}" for what, n in skips.items() if n]
        return "; ".join(parts + self.notes)


class CatalogueError(ValueError):
    """A catalogue that cannot be used as given; the message says what to change."""


@dataclass
class Catalogue:
    """Items and per-user interaction sequences (item ids in time order)."""

    name: str
    items: dict[str, Item]
    sequences: dict[str, tuple[str, ...]] = field(default_factory=dict)
    report: LoadReport = field(default_factory=LoadReport)

    def __post_init__(self) -> None:
        if not self.items:
            raise CatalogueError(
                f"catalogue {self.name!r} has no items ({self.report.summary() or 'nothing read'}); "
                "check the path, the format and the column mapping"
            )

    def __len__(self) -> int:
        return len(self.items)

    @property
    def item_ids(self) -> list[str]:
        return list(self.items)

    @property
    def n_interactions(self) -> int:
        return sum(len(seq) for seq in self.sequences.values())

    def item_counts(self) -> Counter[str]:
        """Interactions per item (popularity) over all sequences."""
        counts: Counter[str] = Counter()
        for seq in self.sequences.values():
            counts.update(seq)
        return counts

    def category_labels(self, depth: int = 0, missing: str = "<none>") -> dict[str, str]:
        """One label per item: its category path element at ``depth`` (the deepest one if the path is shorter)."""
        labels = {}
        for item_id, item in self.items.items():
            cats = item.categories
            labels[item_id] = cats[min(depth, len(cats) - 1)] if cats else missing
        return labels

    def items_dataset(self, index: Any = None) -> Any:
        """A ``datasets.Dataset`` of the items (``item_id``, ``title``, ``description``, ``brand``,
        ``categories`` as a list), plus ``sid`` (the SID string) when a :class:`SIDIndex` is given; items
        missing from the index get ``""``."""
        from datasets import Dataset

        rows: dict[str, list] = {"item_id": [], "title": [], "description": [], "brand": [], "categories": []}
        if index is not None:
            rows["sid"] = []
        for item in self.items.values():
            rows["item_id"].append(item.item_id)
            rows["title"].append(item.title)
            rows["description"].append(item.description)
            rows["brand"].append(item.brand)
            rows["categories"].append(list(item.categories))
            if index is not None:
                rows["sid"].append(index.sid_text(item.item_id) if item.item_id in index else "")
        return Dataset.from_dict(rows)

    def k_core(self, k: int) -> Catalogue:
        """Iteratively drop users and items with fewer than ``k`` interactions (items drop from ``items`` too)."""
        if k <= 1:
            return self
        sequences = dict(self.sequences)
        while True:
            counts = Counter(i for seq in sequences.values() for i in seq)
            keep_items = {i for i, n in counts.items() if n >= k}
            new = {}
            for user, seq in sequences.items():
                kept = tuple(i for i in seq if i in keep_items)
                if len(kept) >= k:
                    new[user] = kept
            if new == sequences:
                break
            sequences = new
        kept_ids = {i for seq in sequences.values() for i in seq}
        items = {i: it for i, it in self.items.items() if i in kept_ids}
        report = dataclasses.replace(self.report, notes=[*self.report.notes])
        report.notes.append(
            f"{k}-core: kept {len(items)}/{len(self.items)} items, {len(sequences)}/{len(self.sequences)} users"
        )
        if not items:
            raise CatalogueError(f"the {k}-core of {self.name!r} is empty; use a smaller k")
        return Catalogue(f"{self.name}", items, sequences, report)

    def subset(self, item_ids: Iterable[str]) -> Catalogue:
        """The catalogue restricted to ``item_ids`` (sequences keep only those items; empty users drop)."""
        keep = set(item_ids)
        items = {i: it for i, it in self.items.items() if i in keep}
        sequences = {}
        for user, seq in self.sequences.items():
            kept = tuple(i for i in seq if i in keep)
            if kept:
                sequences[user] = kept
        return Catalogue(self.name, items, sequences, dataclasses.replace(self.report))

    def leave_one_out(self, min_length: int = 3) -> LeaveOneOut:
        """The leave-one-out split; users with fewer than ``min_length`` (>= 3) interactions are counted and skipped."""
        return LeaveOneOut.from_sequences(self.sequences, min_length=min_length)


@dataclass(frozen=True, slots=True)
class UserSplit:
    """One user under leave-one-out: ``history`` (training), then ``valid``, then ``test``."""

    user_id: str
    history: tuple[str, ...]
    valid: str
    test: str


@dataclass(frozen=True)
class LeaveOneOut:
    """Per-user leave-one-out split.

    Training examples are every prefix of a user's history predicting the next history item, so an item is
    a *training target* each time it appears in a history after the first position.  Validation predicts
    ``valid`` from the history; test predicts ``test`` from history + ``valid``.
    """

    users: tuple[UserSplit, ...]
    skipped_short_users: int = 0
    min_length: int = 3

    @classmethod
    def from_sequences(cls, sequences: Mapping[str, tuple[str, ...]], min_length: int = 3) -> LeaveOneOut:
        if min_length < 3:
            raise ValueError(
                f"min_length={min_length}: leave-one-out needs >= 3 interactions per user "
                "(one training item, a validation and a test target)"
            )
        users, skipped = [], 0
        for user, seq in sequences.items():
            if len(seq) < min_length:
                skipped += 1
                continue
            users.append(UserSplit(user, tuple(seq[:-2]), seq[-2], seq[-1]))
        if skipped:
            logger.info(
                "leave-one-out: skipped %d users with fewer than %d interactions", skipped, min_length
            )
        if not users:
            raise CatalogueError(
                f"no user has at least {min_length} interactions, so leave-one-out has nothing to split "
                f"({skipped} users skipped); use a catalogue with longer histories"
            )
        return cls(tuple(users), skipped, min_length)

    def __len__(self) -> int:
        return len(self.users)

    def train_examples(self, max_history: int | None = None) -> Iterator[tuple[str, tuple[str, ...], str]]:
        """``(user_id, history, target)`` for each position >= 1 of each training history."""
        for u in self.users:
            for t in range(1, len(u.history)):
                start = 0 if max_history is None else max(0, t - max_history)
                yield u.user_id, u.history[start:t], u.history[t]

    def valid_examples(self, max_history: int | None = None) -> Iterator[tuple[str, tuple[str, ...], str]]:
        for u in self.users:
            yield u.user_id, _tail(u.history, max_history), u.valid

    def test_examples(self, max_history: int | None = None) -> Iterator[tuple[str, tuple[str, ...], str]]:
        for u in self.users:
            yield u.user_id, _tail((*u.history, u.valid), max_history), u.test

    def training_target_counts(self) -> Counter[str]:
        """How many times each item is a training target."""
        counts: Counter[str] = Counter()
        for u in self.users:
            counts.update(u.history[1:])
        return counts

    def cold_items(self, max_count: int = 1) -> set[str]:
        """Valid/test targets seen at most ``max_count`` times as a training target."""
        counts = self.training_target_counts()
        targets = {u.valid for u in self.users} | {u.test for u in self.users}
        return {i for i in targets if counts[i] <= max_count}

    def to_datasets(self, max_history: int | None = None) -> Any:
        """A ``datasets.DatasetDict`` with ``train`` / ``valid`` / ``test`` rows ``{user_id, history, target}``."""
        from datasets import Dataset, DatasetDict

        def rows(examples: Iterable[tuple[str, tuple[str, ...], str]]) -> dict[str, list]:
            out: dict[str, list] = {"user_id": [], "history": [], "target": []}
            for user, history, target in examples:
                out["user_id"].append(user)
                out["history"].append(list(history))
                out["target"].append(target)
            return out

        return DatasetDict(
            train=Dataset.from_dict(rows(self.train_examples(max_history))),
            valid=Dataset.from_dict(rows(self.valid_examples(max_history))),
            test=Dataset.from_dict(rows(self.test_examples(max_history))),
        )


def _tail(seq: tuple[str, ...], n: int | None) -> tuple[str, ...]:
    return seq if n is None else seq[-n:] if n > 0 else ()


# The text an item is encoded from: a configurable, serialisable template over its fields.

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
