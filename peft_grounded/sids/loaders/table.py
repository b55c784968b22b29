"""Any CSV / TSV / JSONL table, with a mapping from the package's fields to its columns."""

from __future__ import annotations

import csv
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..._messages import listed
from ..catalogue import Catalogue, CatalogueError, Item, LoadReport
from .common import Interaction, assemble, clean_text, json_lines, open_text, reading, split_categories

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
