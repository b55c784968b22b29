"""RecBole atomic files: ``X.inter`` / ``X.item`` (the embedded MovieLens-100K's format)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ..catalogue import Catalogue, CatalogueError, Item, LoadReport
from .common import Interaction, assemble, clean_text, reading, split_categories

_RECBOLE_ROLES = {
    "title": ("title", "movie_title", "name"),
    "description": ("description",),
    "brand": ("brand",),
    "categories": ("categories", "class", "genre", "genres"),
}


def _atomic_rows(path: Path, report: LoadReport) -> Iterator[dict[str, str]]:
    with reading(path), open(path, encoding="utf-8", newline="") as f:
        header = f.readline().rstrip("\n").split("\t")
        names = [h.split(":")[0] for h in header]
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) != len(names):
                report.malformed_rows += 1
                continue
            yield dict(zip(names, parts, strict=True))


def load_recbole(path: str | Path, name: str | None = None) -> Catalogue:
    """RecBole atomic files ``<name>.inter`` (``user_id``, ``item_id``, ``timestamp``) and ``<name>.item``.

    Item columns map to fields by name (``movie_title``/``title`` -> title, ``class``/``categories`` ->
    categories, split on spaces for ``token_seq`` columns); other columns go to ``extra``.
    """
    path = Path(path)
    if path.is_file():
        path, name = path.parent, name or path.stem
    name = name or path.name
    item_file, inter_file = path / f"{name}.item", path / f"{name}.inter"
    if not item_file.is_file():
        raise CatalogueError(f"no RecBole item file {item_file}; pass the directory and the dataset name")
    report = LoadReport(source=str(item_file))
    with reading(item_file), open(item_file, encoding="utf-8") as f:
        header = f.readline().rstrip("\n").split("\t")
    types = dict(h.split(":", 1) if ":" in h else (h, "token") for h in header)
    roles = {role: next((c for c in cands if c in types), None) for role, cands in _RECBOLE_ROLES.items()}
    used = {c for c in roles.values() if c} | {"item_id"}

    def items() -> Iterator[Item]:
        for row in _atomic_rows(item_file, report):
            cat_col = roles["categories"]
            cat_sep = " " if cat_col and types[cat_col] == "token_seq" else ", "
            yield Item(
                row["item_id"],
                title=clean_text(row.get(roles["title"] or "", "")),
                description=clean_text(row.get(roles["description"] or "", "")),
                brand=clean_text(row.get(roles["brand"] or "", "")),
                categories=split_categories(row.get(cat_col or "", ""), cat_sep),
                extra={k: clean_text(v) for k, v in row.items() if k not in used and v},
            )

    def interactions() -> Iterator[Interaction]:
        if not inter_file.is_file():
            return
        for row in _atomic_rows(inter_file, report):
            ts = row.get("timestamp")
            try:
                yield row["user_id"], row["item_id"], float(ts) if ts else None
            except ValueError:  # a timestamp that is not a number: counted, like every malformed row
                report.malformed_rows += 1

    return assemble(name, items(), interactions(), report)
