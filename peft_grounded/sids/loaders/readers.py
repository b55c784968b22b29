"""What every catalogue reader shares: text cleaning, files named in their errors, and :func:`assemble`, which
turns item records and interactions into a :class:`~peft_grounded.sids.catalogue.Catalogue` counting each skip.

:func:`load_table` (below) reads any CSV / TSV / JSONL table, with a mapping from the package's fields to its
columns.
"""

from __future__ import annotations

import ast
import csv
import gzip
import html
import io
import json
import logging
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ...checks import listed
from ..catalogue import Catalogue, CatalogueError, Item, LoadReport

logger = logging.getLogger(__name__)

_TAG = re.compile(r"<[^<>]{1,200}>")
_SPACE = re.compile(r"\s+")

# (user_id, item_id, timestamp or None)
Interaction = tuple[str, str, float | None]


def clean_text(value: Any) -> str:
    """Text of a field: lists joined with spaces, HTML entities decoded, tags removed, whitespace collapsed."""
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        value = " ".join(clean_text(v) for v in value)
    text = html.unescape(str(value))
    text = _TAG.sub(" ", text)
    return _SPACE.sub(" ", text).strip()


def split_categories(value: Any, separator: str | None = ", ") -> tuple[str, ...]:
    """Category names from a string (split at ``separator``) or a list, each cleaned, empty ones dropped."""
    if value is None or value == "":
        return ()
    if not isinstance(value, (str, list, tuple)):
        raise CatalogueError(
            f"categories must be a string or a list of strings, got {type(value).__name__} {value!r}"
        )
    if not isinstance(value, str):
        return tuple(c for c in (clean_text(p) for p in value) if c)
    parts = value.split(separator) if separator else [value]
    return tuple(c for c in (clean_text(p) for p in parts) if c)


def open_text(path: Path, encoding: str = "utf-8-sig") -> io.TextIOBase:
    """A text file, gzip-compressed or not."""
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding=encoding)
    return open(path, encoding=encoding, newline="")


@contextmanager
def reading(path: Path, item_id: str | None = None) -> Iterator[None]:
    """Name ``path`` (and the item) in the errors raised while reading it: bad bytes, bad JSON, bad CSV,
    a bad field; a catalogue file is never half-read in silence."""
    where = f"{path}: item {item_id!r}" if item_id is not None else str(path)
    try:
        yield
    except UnicodeDecodeError as err:
        raise CatalogueError(
            f"{path} is not UTF-8 text (byte {err.start}: {err.reason}); save it as UTF-8 (e.g. iconv -f latin1 "
            "-t utf-8)"
        ) from None
    except json.JSONDecodeError as err:
        raise CatalogueError(
            f"{path} is not valid JSON (line {err.lineno}, column {err.colno}: {err.msg}); fix or re-export it"
        ) from None
    except (csv.Error, gzip.BadGzipFile, EOFError) as err:
        raise CatalogueError(f"{path} cannot be read ({err}); fix or re-export it") from None
    except CatalogueError as err:
        if str(err).startswith(str(path)):
            raise
        raise CatalogueError(f"{where}: {err}") from None


def read_json_file(path: Path) -> Any:
    """A whole JSON file; errors name the file."""
    with reading(path), open(path, encoding="utf-8-sig") as f:
        return json.load(f)


def assemble(
    name: str,
    items: Iterable[Item],
    interactions: Iterable[Interaction] = (),
    report: LoadReport | None = None,
    keep_items: str = "all",
) -> Catalogue:
    """Build a :class:`Catalogue` from item records and ``(user, item, timestamp)`` rows, counting skips.

    ``keep_items="interacted"`` keeps only items named by at least one kept interaction.
    """
    report = report or LoadReport(source=name)
    table: dict[str, Item] = {}
    for item in items:
        report.items_read += 1
        if item.item_id in table:
            report.duplicate_items += 1
            report.duplicate_item_ids.append(item.item_id)
            if item != table[item.item_id]:
                report.conflicting_item_ids.append(item.item_id)
            continue
        if not item.has_text():
            report.items_without_text += 1
            report.no_text_item_ids.append(item.item_id)
            continue
        table[item.item_id] = item
    per_user: dict[str, list[tuple[float, int, str]]] = {}
    for order, (user, item_id, ts) in enumerate(interactions):
        report.interactions_read += 1
        if item_id not in table:
            report.interactions_unknown_item += 1
            continue
        per_user.setdefault(user, []).append((ts if ts is not None else 0.0, order, item_id))
    sequences = {u: tuple(i for _, _, i in sorted(rows)) for u, rows in per_user.items()}
    if keep_items == "interacted" and sequences:
        used = {i for seq in sequences.values() for i in seq}
        table = {i: it for i, it in table.items() if i in used}
    elif keep_items not in ("all", "interacted"):
        raise ValueError(f"keep_items must be 'all' or 'interacted', got {keep_items!r}")
    for what, n in (
        ("items with no text in any field", report.items_without_text),
        ("interactions naming items missing from the catalogue", report.interactions_unknown_item),
        ("duplicate item ids", report.duplicate_items),
        ("malformed rows", report.malformed_rows),
    ):
        if n:
            logger.warning("%s: skipped %d %s", name, n, what)
    return Catalogue(name, table, sequences, report)


def json_lines(path: Path, report: LoadReport) -> Iterator[dict]:
    """JSON lines; the 2014 metadata's Python-literal lines are read with ``ast.literal_eval``."""
    with reading(path), open_text(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                try:
                    rec = ast.literal_eval(line)
                except (ValueError, SyntaxError):
                    report.malformed_rows += 1
                    continue
            if isinstance(rec, dict):
                yield rec
            else:
                report.malformed_rows += 1


# Any CSV / TSV / JSONL table, with a mapping from the package's fields to its columns.

DEFAULT_ITEM_COLUMNS = {
    "item_id": "item_id",
    "title": "title",
    "description": "description",
    "brand": "brand",
    "categories": "categories",
}
DEFAULT_INTERACTION_COLUMNS = {"user_id": "user_id", "item_id": "item_id", "timestamp": "timestamp"}


def _table_rows(path: Path, report: LoadReport, delimiter: str | None) -> Iterator[dict[str, Any]]:
    name = path.name.removesuffix(".gz")
    if name.endswith((".jsonl", ".json", ".ndjson")):
        yield from json_lines(path, report)
        return
    if delimiter is None:
        delimiter = "\t" if name.endswith(".tsv") else ","
    with reading(path), open_text(path) as f:
        yield from csv.DictReader(f, delimiter=delimiter)


def load_table(
    items: str | Path,
    interactions: str | Path | None = None,
    item_columns: Mapping[str, str] | None = None,
    interaction_columns: Mapping[str, str] | None = None,
    category_separator: str | None = "|",
    delimiter: str | None = None,
    name: str | None = None,
) -> Catalogue:
    """A CSV / TSV / JSONL item table (and optionally an interaction table) with a column mapping.

    ``item_columns`` maps our fields (``item_id``, ``title``, ``description``, ``brand``, ``categories``,
    any extra name) to the file's column names; unmapped standard fields default to the same name when
    present. ``interaction_columns`` maps ``user_id``, ``item_id`` and ``timestamp`` (optional). A
    ``categories`` cell is a list (JSONL) or a string split on ``category_separator``.
    """
    items, report = Path(items), LoadReport(source=str(items))
    icols = {**DEFAULT_ITEM_COLUMNS, **(item_columns or {})}
    xcols = {**DEFAULT_INTERACTION_COLUMNS, **(interaction_columns or {})}
    standard = {"item_id", "title", "description", "brand", "categories"}
    checked: list[bool] = []

    def require(row: Mapping[str, Any], columns: Sequence[str], file: Path, what: str) -> None:
        missing = [c for c in columns if c not in row]
        if missing:
            raise CatalogueError(
                f"{file}: no column {missing} for the {what}; columns are {listed(sorted(row))}; "
                f"map them with --{what.split()[0]}-columns / {what.split()[0]}_columns"
            )

    def item_rows() -> Iterator[Item]:
        for row in _table_rows(items, report, delimiter):
            if not checked:
                require(row, [icols["item_id"]], items, "item id")
                checked.append(True)
            item_id = row.get(icols["item_id"])
            if item_id in (None, ""):
                report.malformed_rows += 1
                continue
            with reading(items, str(item_id)):
                extra = {
                    ours: clean_text(row.get(theirs))
                    for ours, theirs in icols.items()
                    if ours not in standard and row.get(theirs) not in (None, "")
                }
                item = Item(
                    str(item_id),
                    title=clean_text(row.get(icols["title"])),
                    description=clean_text(row.get(icols["description"])),
                    brand=clean_text(row.get(icols["brand"])),
                    categories=split_categories(row.get(icols["categories"]), category_separator),
                    extra=extra,
                )
            yield item

    def interaction_rows() -> Iterator[Interaction]:
        if interactions is None:
            return
        path, first = Path(interactions), True
        for row in _table_rows(path, report, delimiter):
            if first:
                require(row, [xcols["user_id"], xcols["item_id"]], path, "interaction user/item ids")
                first = False
            user, item_id = row.get(xcols["user_id"]), row.get(xcols["item_id"])
            if user in (None, "") or item_id in (None, ""):
                report.malformed_rows += 1
                continue
            ts = row.get(xcols["timestamp"])
            try:
                stamp = float(ts) if ts not in (None, "") else None
            except ValueError:
                report.malformed_rows += 1
                continue
            yield str(user), str(item_id), stamp

    return assemble(name or items.stem.split(".")[0], item_rows(), interaction_rows(), report)
