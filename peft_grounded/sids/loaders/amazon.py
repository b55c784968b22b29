"""Amazon review dumps: 2014 / 2018 ``meta_X.json(.gz)`` + reviews, 2023 JSONL."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from ..catalogue import Catalogue, Item, LoadReport
from .common import Interaction, assemble, clean_text, json_lines, reading, split_categories


def _amazon_item(rec: dict) -> Item | None:
    item_id = rec.get("parent_asin") or rec.get("asin")
    if not item_id:
        return None
    if "categories" in rec and rec["categories"] and isinstance(rec["categories"][0], list):  # 2014
        cats = split_categories(rec["categories"][0])
    else:  # 2018 "category", 2023 "categories" (a path)
        cats = split_categories(rec.get("category") or rec.get("categories"), separator=None)
    details = rec.get("details") if isinstance(rec.get("details"), dict) else {}
    brand = rec.get("brand") or details.get("Brand") or rec.get("store") or ""
    extra = {}
    for key in ("price", "main_category", "features"):
        text = clean_text(rec.get(key))
        if text and text.lower() != "none":
            extra[key] = text
    return Item(
        item_id=str(item_id),
        title=clean_text(rec.get("title")),
        description=clean_text(rec.get("description")),
        brand=clean_text(brand),
        categories=cats,
        extra=extra,
    )


def _amazon_interaction(rec: dict) -> Interaction | None:
    user = rec.get("reviewerID") or rec.get("user_id")
    item_id = rec.get("parent_asin") or rec.get("asin")
    if not user or not item_id:
        return None
    ts = rec.get("unixReviewTime", rec.get("timestamp"))
    return str(user), str(item_id), float(ts) if ts is not None else None


def load_amazon(
    meta: str | Path, reviews: str | Path | None = None, keep_items: str | None = None
) -> Catalogue:
    """Amazon review data: metadata (2014 ``meta_X.json.gz``, 2018 ``meta_X.json.gz``, 2023 ``meta_X.jsonl``)
    and optionally reviews (``X_5.json.gz`` / ``X.json.gz`` / ``X.jsonl``), plain or gzipped.

    The release is recognised per record: 2023 items are keyed by ``parent_asin``, brand falls back to
    ``details["Brand"]`` then ``store``; 2014 takes the first category path. With reviews, only reviewed
    items are kept unless ``keep_items="all"``.
    """
    meta = Path(meta)
    report = LoadReport(source=str(meta))

    def items() -> Iterator[Item]:
        for rec in json_lines(meta, report):
            with reading(meta, str(rec.get("parent_asin") or rec.get("asin"))):
                item = _amazon_item(rec)
            if item is None:
                report.malformed_rows += 1
            else:
                yield item

    def interactions() -> Iterator[Interaction]:
        if reviews is None:
            return
        for rec in json_lines(Path(reviews), report):
            row = _amazon_interaction(rec)
            if row is None:
                report.malformed_rows += 1
            else:
                yield row

    name = re.sub(r"^meta_|\.jsonl?(\.gz)?$|\.gz$", "", meta.name)
    keep = keep_items or ("interacted" if reviews is not None else "all")
    return assemble(name, items(), interactions(), report, keep_items=keep)
