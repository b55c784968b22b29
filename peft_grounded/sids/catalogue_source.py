"""Where a SID index's catalogue was read from, and whether a catalogue is that one.

``build-sids`` records a :class:`CatalogueSource` in the index (``build_config["catalogue_source"]``): the
path as read (absolute, or ``"movielens-100k"``), its format and reader options, the k-core, and a
fingerprint of what was read (the items' ids and titles, the interactions when there are any). Every later
stage reads its catalogue through :func:`index_catalogue`:

1. a catalogue given (a loaded one, a path or a name) is used when its fingerprint is the index's, and
   refused naming both when it is not (MovieLens-100K's ids ``1..1682`` are ids of many numeric catalogues
   too, so ids alone prove nothing);
2. none given: the recorded path, else the same path relative to the index folder (an index and its data
   moved together), each accepted only on its fingerprint; none found is an error that says where it was.
   An index grown by ``add-items`` also records the catalogues its new items were read from
   (``build_config["added_catalogues"]``); its own catalogue is the build's with their items added.

An index pushed to the Hub keeps the name and the fingerprint, never a local path (:meth:`CatalogueSource.public`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from .catalogue import Catalogue, CatalogueError

RECORD_KEY = "catalogue_source"
ADDED_KEY = "added_catalogues"  # the catalogues add-items read new items from, oldest first
PATH_OPTIONS = ("reviews", "interactions")  # reader options that name a file (stored absolute)
BUILTIN = ("movielens-100k",)
logger = logging.getLogger(__name__)


class CatalogueMismatchError(CatalogueError):
    """A catalogue that is not the one a SID index was built from, or one that cannot be found."""


def _digest(payload: Any) -> str:
    return hashlib.sha256(
        json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
    ).hexdigest()[:16]


def fingerprint_items(catalogue: Catalogue) -> str:
    """Short sha256 of the items: their ids and titles, in id order (descriptions, brands and categories may
    be enriched without making it another catalogue)."""
    return _digest([[i, it.title] for i, it in sorted(catalogue.items.items())])


def fingerprint_interactions(catalogue: Catalogue) -> str | None:
    """Short sha256 of the users' sequences in user order; None for a catalogue without interactions."""
    if not catalogue.sequences:
        return None
    return _digest(sorted((u, list(s)) for u, s in catalogue.sequences.items()))


@dataclass(frozen=True)
class CatalogueSource:
    """The catalogue a SID index was built from: where it was read and what it held."""

    name: str = field(metadata={"help": "The catalogue's name (its loader's)."})
    items_fingerprint: str = field(metadata={"help": "fingerprint_items of what was read."})
    interactions_fingerprint: str | None = field(
        default=None, metadata={"help": "fingerprint_interactions of what was read (None: no interactions)."}
    )
    n_items: int = field(default=0, metadata={"help": "Items read."})
    n_users: int = field(default=0, metadata={"help": "Users read."})
    path: str | None = field(
        default=None,
        metadata={
            "help": "Absolute path read, 'movielens-100k', or None (a Catalogue object, or a pushed index)."
        },
    )
    relative_path: str | None = field(
        default=None, metadata={"help": "The path relative to the index folder it was saved to."}
    )
    format: str = field(default="auto", metadata={"help": "The reader's format."})
    options: dict[str, Any] = field(default_factory=dict, metadata={"help": "The reader's options."})
    k_core: int = field(default=0, metadata={"help": "The k-core the build kept (0: none)."})

    # ------------------------------------------------------------------------------------------ record

    @classmethod
    def of(
        cls,
        catalogue: Catalogue,
        path: str | Path | None = None,
        format: str = "auto",
        options: dict[str, Any] | None = None,
        k_core: int = 0,
    ) -> CatalogueSource:
        """The record of ``catalogue`` as read from ``path`` (before the build's k-core)."""
        where = None if path is None else (str(path) if str(path) in BUILTIN else os.path.abspath(path))
        opts = {
            key: (os.path.abspath(value) if key in PATH_OPTIONS and value is not None else value)
            for key, value in (options or {}).items()
        }
        return cls(
            name=catalogue.name,
            items_fingerprint=fingerprint_items(catalogue),
            interactions_fingerprint=fingerprint_interactions(catalogue),
            n_items=len(catalogue.items),
            n_users=len(catalogue.sequences),
            path=where,
            format=format,
            options=opts,
            k_core=int(k_core),
        )

    def with_index_folder(self, folder: str | Path) -> CatalogueSource:
        """This record with the path relative to the index folder ``folder`` (for an index moved with its data)."""
        if self.path is None or self.path in BUILTIN:
            return self
        return replace(self, relative_path=os.path.relpath(self.path, os.path.abspath(folder)))

    def public(self) -> CatalogueSource:
        """This record without local paths (what a pushed index carries)."""
        options = {k: v for k, v in self.options.items() if k not in PATH_OPTIONS}
        path = self.path if self.path in BUILTIN else None
        return replace(self, path=path, relative_path=None, options=options)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, record: Any, where: str) -> CatalogueSource:
        """Read a record written by :meth:`to_dict`; a damaged one names ``where``."""
        known = {f for f in cls.__dataclass_fields__}
        if not isinstance(record, dict) or not {"name", "items_fingerprint"} <= set(record):
            raise CatalogueMismatchError(
                f"{where}: the catalogue record is damaged (needs name and items_fingerprint); rebuild the "
                "index (peft-grounded build-sids) or pass --catalogue with the catalogue it was built from"
            )
        unknown = sorted(set(record) - known)
        if unknown:
            raise CatalogueMismatchError(
                f"{where}: the catalogue record has unknown fields {unknown}; it was written by another "
                "version of peft_grounded: rebuild the index with this one"
            )
        return cls(**record)

    # ------------------------------------------------------------------------------------------ check

    def describe(self) -> str:
        """``name (N items, M users, fingerprint F)``."""
        users = f", {self.n_users} users" if self.interactions_fingerprint else ", no interactions"
        return f"{self.name!r} ({self.n_items} items{users}, fingerprint {self.fingerprint})"

    @property
    def fingerprint(self) -> str:
        """The items' and the interactions' fingerprints, as one string."""
        return self.items_fingerprint + (
            f"/{self.interactions_fingerprint}" if self.interactions_fingerprint else ""
        )

    def matches(self, catalogue: Catalogue) -> bool:
        """Whether ``catalogue`` holds the items and interactions this record was made of."""
        return fingerprint_items(catalogue) == self.items_fingerprint and (
            fingerprint_interactions(catalogue) == self.interactions_fingerprint
        )

    def check(self, catalogue: Catalogue, given: str, index: Any, flag: str) -> None:
        """Refuse ``catalogue`` (read from ``given``) unless it is this record's, naming both and the fix. A
        grown index (``add-items``) takes a catalogue that grew with it: one holding every item it has."""
        if self.matches(catalogue):
            return
        unknown = [i for i in catalogue.items if i not in index]
        missing = [i for i in index.item_ids if i not in catalogue.items]
        if index.parent is not None and not missing:
            return
        other = CatalogueSource.of(catalogue)
        recorded = f" read from {self.path}" if self.path else ""
        extra = (
            f" It holds {len(unknown)} item{'s' if len(unknown) > 1 else ''} the SID index lacks (e.g. "
            f"{unknown[:3]}): new items join an index through peft-grounded add-items."
            if unknown and not missing  # the index's catalogue and more: items to add, not another catalogue
            else ""
        )
        raise CatalogueMismatchError(
            f"the catalogue {given} is {other.describe()}, not the one SID index {_where(index)} was built from: "
            f"{self.describe()}{recorded}.{extra} Pass that catalogue ({flag} PATH), or leave {flag} out to read "
            "it from where the index recorded it; or build an index of this catalogue (peft-grounded build-sids)"
        )

    # ------------------------------------------------------------------------------------------ load

    def read(self, path: str | Path) -> Catalogue:
        """The catalogue at ``path`` read as the build read it (format, options, k-core)."""
        from .loaders import load_catalogue

        options = dict(self.options)
        for key in PATH_OPTIONS:  # a reader's file that moved with the catalogue: the same name beside it
            value = options.get(key)
            if value is not None and not Path(value).exists():
                beside = Path(path).parent / Path(value).name
                options[key] = str(beside) if beside.exists() else value
        return load_catalogue(str(path), format=self.format, **options)

    def cored(self, catalogue: Catalogue) -> Catalogue:
        """``catalogue`` filtered to the build's k-core (as the index's items were)."""
        return catalogue.k_core(self.k_core) if self.k_core > 1 else catalogue

    def candidates(self, index_folder: str | Path | None) -> list[str]:
        """Where the catalogue may be: the recorded path, then the same path relative to the index folder."""
        out = [self.path] if self.path else []
        if self.relative_path and index_folder is not None:
            moved = os.path.normpath(os.path.join(os.path.abspath(index_folder), self.relative_path))
            if moved not in out:
                out.append(moved)
        return out

    def find(self, index_folder: str | Path | None, index_where: str, flag: str) -> Catalogue:
        """The recorded catalogue, found where it was or beside the moved index, checked by its fingerprint."""
        tried: list[str] = []
        for path in self.candidates(index_folder):
            if path not in BUILTIN and not Path(path).exists():
                tried.append(f"{path} (not there)")
                continue
            catalogue = self.read(path)
            if self.matches(catalogue):
                return catalogue
            tried.append(
                f"{path} (holds other items or interactions: {CatalogueSource.of(catalogue).describe()})"
            )
        where = (
            "; ".join(tried)
            if tried
            else "no path was recorded (built from a Catalogue object, or pulled from the Hub)"
        )
        raise CatalogueMismatchError(
            f"SID index {index_where} was built from the catalogue {self.describe()}, and it is not where the "
            f"index recorded it: {where}. Pass it: {flag} PATH (the same items and interactions)"
        )


def added_sources(index: Any) -> list[CatalogueSource]:
    """The catalogues ``add-items`` read the index's new items from, oldest first."""
    return [
        CatalogueSource.from_dict(r, _where(index)) for r in (index.build_config or {}).get(ADDED_KEY, [])
    ]


def _with_added(catalogue: Catalogue, index: Any, flag: str) -> Catalogue:
    """``catalogue`` (the build's) with the items, and any users, of the catalogues the index grew from."""
    items, sequences = dict(catalogue.items), dict(catalogue.sequences)
    for source in added_sources(index):
        added = source.find(None, _where(index), flag)
        items |= {i: it for i, it in added.items.items() if i not in items}
        sequences |= {u: s for u, s in added.sequences.items() if u not in sequences}
    if len(items) == len(catalogue.items) and len(sequences) == len(catalogue.sequences):
        return catalogue
    return Catalogue(catalogue.name, items, sequences, catalogue.report)


def source_of(index: Any) -> CatalogueSource | None:
    """The :class:`CatalogueSource` recorded in ``index``, None when it records none."""
    record = (index.build_config or {}).get(RECORD_KEY)
    if record is None:
        return None
    return CatalogueSource.from_dict(record, _where(index))


def _where(index: Any) -> str:
    folder = getattr(index, "folder", None)
    return str(folder) if folder is not None else f"(fingerprint {index.fingerprint()})"


def index_catalogue(
    index: Any, catalogue: Catalogue | str | Path | None = None, *, flag: str = "--catalogue"
) -> Catalogue:
    """The catalogue ``index`` was built from: ``catalogue`` when given (checked against the index's
    record), else the recorded one (found by :meth:`CatalogueSource.find`). ``flag`` names the setting in
    messages (``catalogue=`` from Python)."""
    source = source_of(index)
    where = _where(index)
    if catalogue is None:
        if source is None:
            raise CatalogueMismatchError(
                f"SID index {where} does not record the catalogue it was built from; pass it ({flag} PATH), or "
                "rebuild the index with peft-grounded build-sids, which records it"
            )
        found = source.cored(source.find(getattr(index, "folder", None), where, flag))
        return _with_added(found, index, flag)
    if isinstance(catalogue, Catalogue):
        loaded, given = catalogue, f"given ({catalogue.name!r})"
    else:
        given = f"{flag} {catalogue}"
        if source is not None and str(catalogue) not in BUILTIN:
            loaded = source.read(catalogue)
        else:
            from .loaders import load_catalogue

            loaded = load_catalogue(str(catalogue))
    if source is None:
        return loaded
    source.check(loaded, given, index, flag)
    return source.cored(loaded)


def catalogue_at_hand(
    index: Any,
    catalogue: Catalogue | str | Path | None = None,
    *,
    needed: bool,
    notes: list[str] | None = None,
) -> Catalogue | None:
    """:func:`index_catalogue` for a step that can go without the catalogue unless ``needed`` (serving's titles, a
    report's categories): the one given, checked; else the index's own where it is found, else None (the reason
    appended to ``notes`` and logged)."""
    if catalogue is not None:
        return index_catalogue(index, catalogue)
    if source_of(index) is None and not needed:
        return None
    try:
        return index_catalogue(index)
    except CatalogueMismatchError as err:
        if needed:
            raise
        logger.info("going on without the catalogue: %s", err)
        if notes is not None:
            notes.append(f"No catalogue: {err}")
        return None


__all__ = [
    "CatalogueMismatchError",
    "CatalogueSource",
    "added_sources",
    "catalogue_at_hand",
    "fingerprint_interactions",
    "fingerprint_items",
    "index_catalogue",
    "source_of",
]
