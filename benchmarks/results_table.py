"""The comparison table that README.md and BENCHMARKS.md show, rendered from one data file,
``docs/results/comparison.json``, so that the two cannot drift apart.

    python benchmarks/results_table.py          # write the tables into README.md and BENCHMARKS.md
    python benchmarks/results_table.py --check  # exit 1, naming the file, where a committed table differs

The JSON holds the table as data: its columns (header, users), its rows (model, training, the BENCHMARKS
section that produced them; optionally ``short`` and ``short_training``, the shorter model name and training
a compact view prints) and each row's cells (value, 95% interval, note, bold; a cell's own ``source`` where it
came from another section than its row). Its ``views`` say which rows and columns each file shows, and how
(``"cells"``: ``"full"``, the default, prints each cell's interval and note and each header's users;
``"value"`` prints the value alone, in bold where the cell says so, the short names and the bare headers, a
table a screen can hold): BENCHMARKS.md all of them in full, README.md a selection, compact. Each file holds its
table between the lines
``<!-- comparison-table:start -->`` and ``<!-- comparison-table:end -->``; everything between them is
replaced. To change a figure, edit the JSON and run this script; ``tests/test_results_table.py`` fails while a
committed table differs from what the script writes.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = Path("docs/results/comparison.json")
START = "<!-- comparison-table:start -->"
END = "<!-- comparison-table:end -->"
NOTICE = "<!-- generated from docs/results/comparison.json by benchmarks/results_table.py -->"
CELLS = ("full", "value")  # a view's cells: value [interval] (note), or the value alone


def load(root: Path = ROOT) -> dict:
    """The comparison's data, checked for what rendering needs (unknown ids, a view naming a missing row)."""
    data = json.loads((root / DATA).read_text(encoding="utf-8"))
    columns = [c["id"] for c in data["columns"]]
    rows = [r["id"] for r in data["rows"]]
    for name, ids in (("column", columns), ("row", rows)):
        if len(set(ids)) != len(ids):
            raise ValueError(f"{DATA}: a {name} id is used twice: {ids}")
    for row in data["rows"]:
        if not row.get("source"):
            raise ValueError(f"{DATA}: row {row['id']!r} names no source section")
        unknown = set(row["cells"]) - set(columns)
        if unknown:
            raise ValueError(f"{DATA}: row {row['id']!r} has cells of unknown columns {sorted(unknown)}")
    for file, view in data["views"].items():
        for name, known in (("columns", columns), ("rows", rows)):
            missing = set(view[name]) - set(known) if view[name] != "all" else set()
            if missing:
                raise ValueError(f"{DATA}: the view of {file} names unknown {name} {sorted(missing)}")
        unknown = set(view) - {"rows", "columns", "cells"}
        if unknown:
            raise ValueError(f"{DATA}: the view of {file} has unknown keys {sorted(unknown)}")
        if view.get("cells", "full") not in CELLS:
            raise ValueError(f"{DATA}: the view of {file} asks for cells {view['cells']!r}; one of {CELLS}")
    return data


def number(value: int | float, decimals: int) -> str:
    """A float with ``decimals`` digits; an integer as written (0 is "0", 0.0 is "0.000")."""
    return str(value) if isinstance(value, int) else f"{value:.{decimals}f}"


def cell_text(cell: dict | None, decimals: int, cells: str = "full") -> str:
    """``value [low, high]``, in bold where the cell says so, then `` (note)``; with ``cells="value"`` the value
    alone (in bold where the cell says so); empty without a cell."""
    if not cell:
        return ""
    text = number(cell["value"], decimals)
    if "ci" in cell and cells == "full":
        low, high = cell["ci"]
        text += f" [{number(low, decimals)}, {number(high, decimals)}]"
    if cell.get("bold"):
        text = f"**{text}**"
    if cell.get("note") and cells == "full":
        text += f" ({cell['note']})"
    return text


def render(data: dict, file: str) -> str:
    """The markdown table of ``file``'s view: its rows and columns in the order the view lists them; each cell in
    full, or its value alone where the view is compact (``"cells": "value"``)."""
    view = data["views"][file]
    columns, rows = (_pick(data[name], view[name]) for name in ("columns", "rows"))
    decimals = data.get("decimals", 3)
    full = view.get("cells", "full") == "full"
    headers = [
        "model",
        *(f"{c['header']} ({c['users']})" if full else c["header"] for c in columns),
        "training",
    ]
    lines = [line(headers), "|" + "---|" * len(headers)]
    for row in rows:
        cells = [cell_text(row["cells"].get(c["id"]), decimals, "full" if full else "value") for c in columns]
        model = row["model"] if full else row.get("short", row["model"])
        training = row["training"] if full else row.get("short_training", row["training"])
        lines.append(line([model, *cells, training]))
    return "\n".join(lines)


def _pick(items: list[dict], ids: list[str] | str) -> list[dict]:
    """``items`` in the view's order (``"all"``: the JSON's order)."""
    by_id = {item["id"]: item for item in items}
    return items if ids == "all" else [by_id[i] for i in ids]


def line(cells: list[str]) -> str:
    """One markdown table line; an empty cell is ``| |``."""
    return "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"


def with_table(text: str, table: str, file: str) -> str:
    """``text`` with what stands between its markers replaced by ``table``."""
    pattern = re.compile(re.escape(START) + r".*?" + re.escape(END), flags=re.S)
    found = pattern.findall(text)
    if len(found) != 1:
        raise ValueError(f"{file}: expected one {START} ... {END} block, found {len(found)}")
    block = f"{START}\n{NOTICE}\n\n{table}\n\n{END}"
    return pattern.sub(lambda _: block, text)


def expected(root: Path = ROOT) -> dict[str, tuple[str, str]]:
    """Per file of the JSON's views: (its text now, its text with the generated table)."""
    data = load(root)
    out = {}
    for file in data["views"]:
        text = (root / file).read_text(encoding="utf-8")
        out[file] = (text, with_table(text, render(data, file), file))
    return out


def check(root: Path = ROOT) -> list[str]:
    """The files whose committed table differs from the generated one (or that lack the markers)."""
    try:
        pairs = expected(root)
    except (ValueError, KeyError, OSError) as error:
        return [str(error)]
    return [
        f"{file}: its comparison table differs from {DATA}"
        for file, (now, new) in pairs.items()
        if now != new
    ]


@dataclass
class Settings:
    check: bool = field(
        default=False, metadata={"help": "write nothing; exit 1 where a committed table differs"}
    )
    root: Path = field(default=ROOT, metadata={"help": "the checkout holding the JSON and the two files"})


def parse_args(argv=None) -> Settings:
    try:
        from benchmarks._args import parse
    except ModuleNotFoundError:  # run as a file: its folder is on sys.path, not the repository
        from _args import parse

    return parse(
        Settings,
        argv,
        prog="results_table.py",
        description=__doc__,
        check=lambda args: summary(load(args.root)),
    )


def summary(data: dict) -> str:
    """What ``--dry-run`` prints: the table's size and the files it is written into."""
    return (
        f"{len(data['rows'])} rows x {len(data['columns'])} columns, written into {', '.join(data['views'])}"
    )


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.check:
        problems = check(args.root)
        for problem in problems:
            print(f"{problem}; run python benchmarks/results_table.py", file=sys.stderr)
        if not problems:
            print("results_table.py: README.md and BENCHMARKS.md match docs/results/comparison.json")
        return 1 if problems else 0
    for file, (now, new) in expected(args.root).items():
        if now != new:
            (args.root / file).write_text(new, encoding="utf-8")
            print(f"wrote the comparison table of {file}")
        else:
            print(f"{file}: up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
