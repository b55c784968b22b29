"""Readers for the common catalogue formats, all returning a :class:`~peft_grounded.sids.catalogue.Catalogue`.

=========================  ======================================================================
``load_lcrec``             LC-Rec / MiniOneRec JSON: ``X.item.json`` + ``X.inter.json``
``load_amazon``            Amazon review dumps: 2014 / 2018 ``meta_X.json(.gz)`` + reviews, 2023 JSONL
``load_movielens``         ml-100k ``u.data`` / ``u.item``; ml-1m ``ratings.dat`` / ``movies.dat``
``load_recbole``           RecBole atomic files ``X.inter`` / ``X.item`` (MovieLens-100K default)
``load_table``             any CSV / TSV / JSONL with a column mapping
``load_catalogue``         picks one of the above from a path (or ``"movielens-100k"``)
=========================  ======================================================================

Every loader cleans text the same way (HTML entities decoded, tags dropped, whitespace collapsed), keeps
the first of duplicate item ids, drops items with no text in any field and interactions naming items that
are not in the catalogue, and counts each skip in ``catalogue.report``.  Sequences are ordered by
timestamp where the format has one, ties and timestamp-less formats keeping file order.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...checks import listed
from ..catalogue import Catalogue, CatalogueError
from .datasets import LCREC_INTERACTIONS, LCREC_ITEMS, load_amazon, load_lcrec, load_movielens, load_recbole
from .readers import assemble, clean_text, load_table

__all__ = [
    "BUILTIN",
    "assemble",
    "clean_text",
    "detect_format",
    "load_amazon",
    "load_catalogue",
    "load_lcrec",
    "load_movielens",
    "load_recbole",
    "load_table",
]

logger = logging.getLogger(__name__)


def _amazon_reviews(folder: Path, meta: Path, stem: str) -> Path | None:
    """The one reviews file beside ``meta`` (its name holds ``stem``); several are an error, none a warning."""
    found = sorted(p for p in folder.iterdir() if p != meta and stem in p.name and not p.name.startswith("."))
    if len(found) > 1:
        raise CatalogueError(
            f"{folder}: {len(found)} review files for {meta.name} ({listed([p.name for p in found])}); pass the "
            "one to use: reviews=... (--reviews FILE)"
        )
    if not found:
        logger.warning(
            "%s: no review file for %s (a name holding %r), so the catalogue has items but no interactions; "
            "pass reviews=... (--reviews FILE) to load them",
            folder,
            meta.name,
            stem,
        )
        return None
    return found[0]


BUILTIN = ("movielens-100k",)


def detect_format(path: Path) -> str:
    """The format of a catalogue path: lcrec, movielens, recbole, amazon or table."""
    if path.is_file():
        name = path.name.removesuffix(".gz")
        if name.endswith((LCREC_ITEMS, LCREC_INTERACTIONS)):
            return "lcrec"
        if name.endswith((".item", ".inter")):
            return "recbole"
        if name.startswith("meta_"):
            return "amazon"
        if name.endswith((".csv", ".tsv", ".jsonl", ".ndjson", ".json")):
            return "table"
    elif path.is_dir():
        if any(path.glob(f"*{LCREC_ITEMS}")):
            return "lcrec"
        if any((path / name).is_file() for name in ("u.item", "movies.dat", "movies.csv")):
            return "movielens"
        if any(path.glob("*.item")):
            return "recbole"
        if any(path.glob("meta_*")):
            return "amazon"
    elif not path.exists():
        if Path(str(path) + LCREC_ITEMS).is_file():
            return "lcrec"
        raise CatalogueError(f"catalogue path {path} does not exist")
    raise CatalogueError(
        f"cannot tell the format of {path}; pass format= one of lcrec, amazon, movielens, recbole, table"
    )


def load_catalogue(source: str | Path = "movielens-100k", format: str = "auto", **kwargs: Any) -> Catalogue:
    """Load a catalogue from ``source`` (a path, or ``"movielens-100k"`` for the embedded data set).

    ``format`` is ``auto`` or one of ``lcrec``, ``amazon``, ``movielens``, ``recbole``, ``table``; keyword
    arguments go to the loader (e.g. ``reviews=`` for amazon, ``item_columns=`` for table).
    """
    if str(source) in BUILTIN:
        from peft_grounded import assets

        return load_recbole(assets.movielens_100k(), "ml-100k")
    path = Path(source)
    fmt = detect_format(path) if format == "auto" else format
    loaders: dict[str, Callable[..., Catalogue]] = {
        "lcrec": load_lcrec,
        "amazon": load_amazon,
        "movielens": load_movielens,
        "recbole": load_recbole,
        "table": load_table,
    }
    if fmt not in loaders:
        raise CatalogueError(f"unknown catalogue format {fmt!r}; use one of {sorted(loaders)}")
    if fmt == "amazon" and path.is_dir():
        metas = sorted(path.glob("meta_*"))
        if len(metas) != 1:
            raise CatalogueError(f"{path}: expected one meta_* file, found {len(metas)}; pass it directly")
        stem = re.sub(r"^meta_|\.jsonl?(\.gz)?$|\.gz$", "", metas[0].name)
        if "reviews" not in kwargs:
            kwargs["reviews"] = _amazon_reviews(path, metas[0], stem)
        path = metas[0]
    return loaders[fmt](path, **kwargs)


def as_catalogue(catalogue: Catalogue | str | Path | None) -> Catalogue | None:
    """``catalogue`` as a :class:`Catalogue`: one already loaded as it is, a name or path through
    :func:`load_catalogue`, None as None."""
    if catalogue is None or isinstance(catalogue, Catalogue):
        return catalogue
    return load_catalogue(str(catalogue))
