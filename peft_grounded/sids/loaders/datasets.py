"""The named public formats, each a reader returning a :class:`~peft_grounded.sids.catalogue.Catalogue`:

* MovieLens: ml-100k ``u.data`` / ``u.item``; ml-1m ``ratings.dat`` / ``movies.dat``;
* Amazon review dumps: 2014 / 2018 ``meta_X.json(.gz)`` + reviews, 2023 JSONL;
* LC-Rec / MiniOneRec JSON catalogues: ``X.item.json`` + ``X.inter.json``;
* RecBole atomic files: ``X.inter`` / ``X.item`` (the embedded MovieLens-100K's format).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from ...checks import listed
from ..catalogue import Catalogue, CatalogueError, Item, LoadReport
from .readers import (
    Interaction,
    assemble,
    clean_text,
    json_lines,
    load_table,
    read_json_file,
    reading,
    split_categories,
)

ML100K_GENRES = (
    "unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary", "Drama",
    "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller", "War", "Western",
)  # fmt: skip


def load_movielens(path: str | Path) -> Catalogue:
    """MovieLens raw files: ml-100k (``u.data`` + ``u.item``, ``|``-separated, latin-1), ml-1m
    (``ratings.dat`` + ``movies.dat``, ``::``-separated) or ml-20m and later (``movies.csv`` +
    ``ratings.csv``). Genres become ``categories``."""
    path = Path(path)
    report = LoadReport(source=str(path))
    if (path / "u.item").is_file():
        genres = list(ML100K_GENRES)
        if (path / "u.genre").is_file():
            with open(path / "u.genre", encoding="latin-1") as f:
                rows = [line.strip().split("|") for line in f if line.strip()]
            genres = [g for g, _ in sorted(rows, key=lambda r: int(r[1]))]

        def items() -> Iterator[Item]:
            with open(path / "u.item", encoding="latin-1") as f:
                for line in f:
                    parts = line.rstrip("\n").split("|")
                    if len(parts) < 5:
                        report.malformed_rows += 1
                        continue
                    flags = parts[5:]
                    extra = {"release_date": parts[2]} if parts[2] else {}
                    yield Item(
                        parts[0],
                        title=clean_text(parts[1]),
                        categories=tuple(g for g, f in zip(genres, flags, strict=False) if f == "1"),
                        extra=extra,
                    )

        inter_file, sep = path / "u.data", "\t"
    elif (path / "movies.dat").is_file():

        def items() -> Iterator[Item]:
            with open(path / "movies.dat", encoding="latin-1") as f:
                for line in f:
                    parts = line.rstrip("\n").split("::")
                    if len(parts) != 3:
                        report.malformed_rows += 1
                        continue
                    yield Item(
                        parts[0], title=clean_text(parts[1]), categories=split_categories(parts[2], "|")
                    )

        inter_file, sep = path / "ratings.dat", "::"
    elif (path / "movies.csv").is_file():  # ml-20m / ml-25m / ml-latest
        return load_table(
            path / "movies.csv",
            path / "ratings.csv" if (path / "ratings.csv").is_file() else None,
            item_columns={"item_id": "movieId", "title": "title", "categories": "genres"},
            interaction_columns={"user_id": "userId", "item_id": "movieId", "timestamp": "timestamp"},
            category_separator="|",
            name=path.name,
        )
    else:
        raise CatalogueError(
            f"{path} holds no MovieLens files: ml-100k (u.item, u.data), ml-1m (movies.dat, ratings.dat) "
            "or ml-20m and later (movies.csv, ratings.csv)"
        )

    def interactions() -> Iterator[Interaction]:
        if not inter_file.is_file():
            return
        with open(inter_file, encoding="latin-1") as f:
            for line in f:
                parts = line.strip().split(sep)
                if len(parts) < 4:
                    if line.strip():
                        report.malformed_rows += 1
                    continue
                try:
                    yield parts[0], parts[1], float(parts[3])
                except ValueError:
                    report.malformed_rows += 1

    return assemble(path.name, items(), interactions(), report)


# Amazon review dumps: 2014 / 2018 ``meta_X.json(.gz)`` + reviews, 2023 JSONL.


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


# LC-Rec / MiniOneRec JSON catalogues: ``X.item.json`` + ``X.inter.json``.

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


# RecBole atomic files: ``X.inter`` / ``X.item`` (the embedded MovieLens-100K's format).

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
