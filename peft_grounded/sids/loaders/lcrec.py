"""LC-Rec / MiniOneRec JSON catalogues: ``X.item.json`` + ``X.inter.json``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ..._messages import listed
from ..catalogue import Catalogue, CatalogueError, Item, LoadReport
from .common import Interaction, assemble, clean_text, read_json_file, reading, split_categories

LCREC_ITEMS, LCREC_INTERACTIONS = ".item.json", ".inter.json"


def _lcrec_files(path: Path) -> tuple[Path, Path | None, str]:
    if path.is_dir():
        found = sorted(path.glob(f"*{LCREC_ITEMS}"))
        if len(found) != 1:
            raise CatalogueError(
                f"{path} should hold exactly one '*.item.json' file (found {len(found)}); "
                "pass the file itself or the prefix (e.g. data/Office/Office)"
            )
        item_file = found[0]
    elif path.name.endswith(LCREC_ITEMS):
        item_file = path
    elif path.name.endswith(LCREC_INTERACTIONS):  # the pair's other file: a natural mistake, same data set
        item_file = path.with_name(path.name[: -len(LCREC_INTERACTIONS)] + LCREC_ITEMS)
    else:
        item_file = path.with_name(path.name + LCREC_ITEMS)
    if not item_file.is_file():
        raise CatalogueError(f"no LC-Rec item file at {item_file}")
    stem = item_file.name[: -len(LCREC_ITEMS)]
    inter_file = item_file.with_name(stem + LCREC_INTERACTIONS)
    return item_file, inter_file if inter_file.is_file() else None, stem


def load_lcrec(path: str | Path) -> Catalogue:
    """LC-Rec / MiniOneRec JSON: ``{"id": {title, description, brand, categories}}`` and ``{"user": [ids]}``.

    ``path`` is the directory, the ``X.item.json`` or ``X.inter.json`` file, or the ``X`` prefix.
    ``categories`` is a string joined with ", " (split back into a path; a category name that itself holds
    ", " splits too) or a list.
    """
    item_file, inter_file, stem = _lcrec_files(Path(path))
    raw = read_json_file(item_file)
    if not isinstance(raw, dict):
        raise CatalogueError(f"{item_file} should map item ids to records, got a {type(raw).__name__}")
    report = LoadReport(source=str(item_file))

    def items() -> Iterator[Item]:
        for item_id, rec in raw.items():
            if not isinstance(rec, dict):
                report.malformed_rows += 1
                continue
            known = {"title", "description", "brand", "categories"}
            with reading(item_file, str(item_id)):
                item = Item(
                    item_id=str(item_id),
                    title=clean_text(rec.get("title")),
                    description=clean_text(rec.get("description")),
                    brand=clean_text(rec.get("brand")),
                    categories=split_categories(rec.get("categories")),
                    extra={
                        k: clean_text(v) for k, v in rec.items() if k not in known and v not in (None, "")
                    },
                )
            yield item

    def interactions() -> Iterator[Interaction]:
        if inter_file is None:
            return
        seqs = read_json_file(inter_file)
        if not isinstance(seqs, dict):
            raise CatalogueError(
                f'{inter_file} should map user ids to lists of item ids ({{"user": ["item", ...]}}), got a '
                f"{type(seqs).__name__}; fix the file, or remove it to load the items alone"
            )
        bad = [user for user, seq in seqs.items() if not isinstance(seq, list)]
        if bad:
            raise CatalogueError(
                f"{inter_file}: the sequences of {len(bad)} users are not lists of item ids (users {listed(bad)}); "
                'each value should be a list such as ["item1", "item2"]'
            )
        for user, seq in seqs.items():
            for t, item_id in enumerate(seq):
                yield str(user), str(item_id), float(t)

    return assemble(stem, items(), interactions(), report)
