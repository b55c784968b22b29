"""Small catalogue files in every supported format, written by the tests themselves, and clustered vectors."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np

from peft_grounded.sids.build import index_from_vectors
from peft_grounded.sids.index import SIDIndex
from peft_grounded.sids.quantizers import RQKMeansConfig

# Five items; "i5" has no text at all; the interactions name "ghost", which is not in the catalogue.
ITEMS = {
    "i1": {
        "title": "Blue Pen",
        "description": "A ballpoint pen &amp; cap",
        "brand": "Acme",
        "cats": ["Office", "Pens"],
    },
    "i2": {"title": "Red Pen", "description": "", "brand": "Acme", "cats": ["Office", "Pens"]},
    "i3": {
        "title": "Stapler",
        "description": "<b>Heavy</b> duty",
        "brand": "",
        "cats": ["Office", "Staplers"],
    },
    "i4": {
        "title": "Desk Lamp",
        "description": "LED lamp",
        "brand": "Lumo",
        "cats": ["Furniture", "Lighting"],
    },
    "i5": {"title": "", "description": "", "brand": "", "cats": []},
}
# user -> [(item, timestamp)], deliberately out of time order in the files.
INTERACTIONS = {
    "u1": [("i2", 20), ("i1", 10), ("i3", 30), ("i4", 40)],
    "u2": [("i1", 5), ("ghost", 6), ("i2", 7), ("i3", 8)],
    "u3": [("i4", 1), ("i1", 2)],
}
# The expected sequences once loaded (time order; "ghost" dropped).
EXPECTED_SEQUENCES = {"u1": ("i1", "i2", "i3", "i4"), "u2": ("i1", "i2", "i3"), "u3": ("i4", "i1")}


def _rows() -> list[tuple[str, str, int]]:
    return [(u, i, t) for u, rows in INTERACTIONS.items() for i, t in rows]


def write_lcrec(directory: Path, name: str = "Toy") -> Path:
    """``<name>.item.json`` + ``<name>.inter.json`` (sequences already in time order, as LC-Rec stores them)."""
    directory.mkdir(parents=True, exist_ok=True)
    items = {
        k: {
            "title": v["title"],
            "description": v["description"],
            "brand": v["brand"],
            "categories": ", ".join(v["cats"]),
        }
        for k, v in ITEMS.items()
    }
    inters = {u: [i for i, _ in sorted(rows, key=lambda r: r[1])] for u, rows in INTERACTIONS.items()}
    (directory / f"{name}.item.json").write_text(json.dumps(items))
    (directory / f"{name}.inter.json").write_text(json.dumps(inters))
    return directory


def write_amazon(directory: Path, release: int) -> tuple[Path, Path]:
    """Metadata and reviews in the 2014 (Python literals, gzipped), 2018 or 2023 layouts."""
    directory.mkdir(parents=True, exist_ok=True)
    meta_lines, review_lines = [], []
    for k, v in ITEMS.items():
        if release == 2014:
            rec = {"asin": k, "title": v["title"], "description": v["description"], "brand": v["brand"]}
            rec["categories"] = [v["cats"]] if v["cats"] else []
            meta_lines.append(repr(rec))  # the 2014 dump is Python literals, not JSON
        elif release == 2018:
            rec = {"asin": k, "title": v["title"], "description": [v["description"]], "brand": v["brand"]}
            rec["category"] = v["cats"]
            meta_lines.append(json.dumps(rec))
        else:
            rec = {
                "parent_asin": k,
                "title": v["title"],
                "description": [v["description"]] if v["description"] else [],
                "store": "",
                "details": {"Brand": v["brand"]} if v["brand"] else {},
                "categories": v["cats"],
                "price": None,
            }
            meta_lines.append(json.dumps(rec))
    for u, i, t in _rows():
        if release == 2023:
            review_lines.append(
                json.dumps({"user_id": u, "asin": i + "-v", "parent_asin": i, "timestamp": t * 1000})
            )
        else:
            review_lines.append(json.dumps({"reviewerID": u, "asin": i, "overall": 5.0, "unixReviewTime": t}))
    if release == 2014:
        meta, reviews = directory / "meta_Toy.json.gz", directory / "reviews_Toy_5.json.gz"
        with gzip.open(meta, "wt") as f:
            f.write("\n".join(meta_lines) + "\n")
        with gzip.open(reviews, "wt") as f:
            f.write("\n".join(review_lines) + "\n")
    else:
        ext = "jsonl" if release == 2023 else "json"
        meta, reviews = directory / f"meta_Toy.{ext}", directory / f"Toy.{ext}"
        meta.write_text("\n".join(meta_lines) + "\n")
        reviews.write_text("\n".join(review_lines) + "\n")
    return meta, reviews


def write_ml100k(directory: Path) -> Path:
    """``u.item`` (``|``-separated, latin-1, 19 genre flags) and ``u.data`` (tab-separated)."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = [
        "1|Toy Story (1995)|01-Jan-1995||http://x|0|0|0|1|1|1|0|0|0|0|0|0|0|0|0|0|0|0|0",
        "2|GoldenEye (1995)|01-Jan-1995||http://x|0|1|1|0|0|0|0|0|0|0|0|0|0|0|0|0|1|0|0",
        "3|Café Society (1995)|01-Jan-1995||http://x|0|0|0|0|0|0|0|0|1|0|0|0|0|0|0|0|0|0|0",
    ]
    (directory / "u.item").write_bytes(("\n".join(lines) + "\n").encode("latin-1"))
    data = ["7\t2\t4\t300", "7\t1\t5\t100", "7\t3\t3\t200", "8\t1\t4\t50", "8\t9\t4\t60"]
    (directory / "u.data").write_text("\n".join(data) + "\n")
    return directory


def write_ml1m(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    movies = [
        "1::Toy Story (1995)::Animation|Children's|Comedy",
        "2::Jumanji (1995)::Adventure|Fantasy",
        "bad line",
    ]
    (directory / "movies.dat").write_bytes(("\n".join(movies) + "\n").encode("latin-1"))
    (directory / "ratings.dat").write_text("1::2::5::978300760\n1::1::3::978300700\n2::1::4::978300000\n")
    return directory


def write_recbole(directory: Path, name: str = "toy") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    item = ["item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq"]
    item += ["1\tToy Story\t1995\tAnimation Comedy", "2\tHeat\t1995\tAction Crime Thriller"]
    inter = ["user_id:token\titem_id:token\trating:float\ttimestamp:float"]
    inter += ["5\t2\t3\t20", "5\t1\t4\t10", "6\t1\t2\t5", "6\t77\t2\t6"]
    (directory / f"{name}.item").write_text("\n".join(item) + "\n")
    (directory / f"{name}.inter").write_text("\n".join(inter) + "\n")
    return directory


def write_table(directory: Path, kind: str = "csv") -> tuple[Path, Path]:
    """Items with non-standard column names (``asin``, ``name``, ``cat``) and interactions."""
    directory.mkdir(parents=True, exist_ok=True)
    if kind == "csv":
        items = directory / "items.csv"
        rows = ["asin,name,cat,maker,price"]
        rows += [f'{k},"{v["title"]}",{"|".join(v["cats"])},{v["brand"]},1.5' for k, v in ITEMS.items()]
        items.write_text("\n".join(rows) + "\n")
        inter = directory / "events.csv"
        inter.write_text("uid,iid,ts\n" + "\n".join(f"{u},{i},{t}" for u, i, t in _rows()) + "\n")
    else:
        items = directory / "items.jsonl"
        items.write_text(
            "\n".join(
                json.dumps(
                    {"asin": k, "name": v["title"], "cat": v["cats"], "maker": v["brand"], "price": 1.5}
                )
                for k, v in ITEMS.items()
            )
            + "\n"
        )
        inter = directory / "events.jsonl"
        inter.write_text("\n".join(json.dumps({"uid": u, "iid": i, "ts": t}) for u, i, t in _rows()) + "\n")
    return items, inter


TABLE_ITEM_COLUMNS = {
    "item_id": "asin",
    "title": "name",
    "categories": "cat",
    "brand": "maker",
    "price": "price",
}
TABLE_INTERACTION_COLUMNS = {"user_id": "uid", "item_id": "iid", "timestamp": "ts"}


def clustered_vectors(
    n_clusters: int = 8, sub: int = 4, per_sub: int = 12, dim: int = 32, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Residual structure: ``x = centre[c] + offset[s] + noise``, cluster centres far apart, ``sub`` offsets
    shared by every cluster and smaller, noise smaller still. Returns ``(vectors, cluster, offset)`` labels."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(n_clusters, dim)) * 10.0
    offsets = rng.normal(size=(sub, dim)) * 2.0
    cluster = np.repeat(np.arange(n_clusters), sub * per_sub)
    offset = np.tile(np.repeat(np.arange(sub), per_sub), n_clusters)
    x = centres[cluster] + offsets[offset] + rng.normal(size=(len(cluster), dim)) * 0.2
    order = rng.permutation(len(cluster))
    return x.astype(np.float32)[order], cluster[order], offset[order]


def purity(pred: np.ndarray, truth: np.ndarray) -> float:
    """Share of items whose predicted cluster's majority true label is their own."""
    total = 0
    for p in np.unique(pred):
        total += np.bincount(truth[pred == p]).max()
    return total / len(truth)


def office_dir() -> Path | None:
    """The shared Amazon Office catalogue (``<checkout>/../shared/data/amazon-office``), if present."""
    here = Path(__file__).resolve().parents[2]
    for candidate in (
        here.parent / "shared" / "data" / "amazon-office",
        Path("/work/shared/data/amazon-office"),
    ):
        if (candidate / "Office.item.json").is_file():
            return candidate
    return None


ENCODER = {"kind": "toy", "model": "clusters", "dim": 32}


def growth_vectors(n_old: int = 60):
    """Old and new item vectors (80 items, 32-d; the parent holds a collision group of 3)."""
    x, _, _ = clustered_vectors(n_clusters=4, sub=2, per_sub=10, seed=0)  # 80 items, 32-d
    x[1] = x[2] = x[0]  # a collision group of 3 in the parent
    return x[:n_old], x[n_old:]


def parent_index(dedup: str = "level", codes=(4, 4)) -> SIDIndex:
    """A parent SID index of the old vectors, with encoder, template, interactions and categories recorded."""
    old, _ = growth_vectors()
    return index_from_vectors(
        old,
        [f"old{i}" for i in range(len(old))],
        RQKMeansConfig(codes_per_level=codes, seed=0),
        dedup=dedup,
        encoder=ENCODER,
        text_template={"fields": ["title"]},
        item_interactions=np.arange(len(old)),
        item_categories=[("c",)] * len(old),
    )
