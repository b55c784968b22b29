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

import ast
import csv
import gzip
import html
import io
import json
import logging
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .._messages import listed
from .catalogue import Catalogue, CatalogueError, Item, LoadReport

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


def _categories(value: Any, separator: str | None = ", ") -> tuple[str, ...]:
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


def _open_text(path: Path, encoding: str = "utf-8-sig") -> io.TextIOBase:
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


def _read_json(path: Path) -> Any:
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


# ----------------------------------------------------------------------------------------- LC-Rec JSON


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
    raw = _read_json(item_file)
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
                    categories=_categories(rec.get("categories")),
                    extra={
                        k: clean_text(v) for k, v in rec.items() if k not in known and v not in (None, "")
                    },
                )
            yield item

    def interactions() -> Iterator[Interaction]:
        if inter_file is None:
            return
        seqs = _read_json(inter_file)
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


# ----------------------------------------------------------------------------------------- Amazon dumps


def _json_lines(path: Path, report: LoadReport) -> Iterator[dict]:
    """JSON lines; the 2014 metadata's Python-literal lines are read with ``ast.literal_eval``."""
    with reading(path), _open_text(path) as f:
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


def _amazon_item(rec: dict) -> Item | None:
    item_id = rec.get("parent_asin") or rec.get("asin")
    if not item_id:
        return None
    if "categories" in rec and rec["categories"] and isinstance(rec["categories"][0], list):  # 2014
        cats = _categories(rec["categories"][0])
    else:  # 2018 "category", 2023 "categories" (a path)
        cats = _categories(rec.get("category") or rec.get("categories"), separator=None)
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
        for rec in _json_lines(meta, report):
            with reading(meta, str(rec.get("parent_asin") or rec.get("asin"))):
                item = _amazon_item(rec)
            if item is None:
                report.malformed_rows += 1
            else:
                yield item

    def interactions() -> Iterator[Interaction]:
        if reviews is None:
            return
        for rec in _json_lines(Path(reviews), report):
            row = _amazon_interaction(rec)
            if row is None:
                report.malformed_rows += 1
            else:
                yield row

    name = re.sub(r"^meta_|\.jsonl?(\.gz)?$|\.gz$", "", meta.name)
    keep = keep_items or ("interacted" if reviews is not None else "all")
    return assemble(name, items(), interactions(), report, keep_items=keep)


# ----------------------------------------------------------------------------------------- MovieLens

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
                    yield Item(parts[0], title=clean_text(parts[1]), categories=_categories(parts[2], "|"))

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


# ----------------------------------------------------------------------------------------- RecBole

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
                categories=_categories(row.get(cat_col or "", ""), cat_sep),
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


# ----------------------------------------------------------------------------------------- generic tables

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
        yield from _json_lines(path, report)
        return
    if delimiter is None:
        delimiter = "\t" if name.endswith(".tsv") else ","
    with reading(path), _open_text(path) as f:
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
                    categories=_categories(row.get(icols["categories"]), category_separator),
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


# ----------------------------------------------------------------------------------------- dispatch


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
