"""MovieLens: ml-100k ``u.data`` / ``u.item``; ml-1m ``ratings.dat`` / ``movies.dat``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ..catalogue import Catalogue, CatalogueError, Item, LoadReport
from .common import Interaction, assemble, clean_text, split_categories
from .table import load_table

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
