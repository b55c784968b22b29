"""The comparison table of README.md and BENCHMARKS.md is generated from docs/results/comparison.json
(benchmarks/results_table.py): the committed tables are the script's output, a changed cell is caught, and
every cell names a BENCHMARKS.md section that exists. No model runs."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from benchmarks import results_table

ROOT = Path(__file__).resolve().parent.parent


def copy_checkout(tmp_path: Path) -> Path:
    """The three files the script reads and writes, in a temp folder laid out as the checkout."""
    for name in ("README.md", "BENCHMARKS.md", str(results_table.DATA)):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    return tmp_path


def table_of(text: str) -> str:
    start, end = text.index(results_table.START), text.index(results_table.END)
    return text[start:end]


def test_the_committed_tables_are_the_scripts_output():
    assert results_table.check(ROOT) == []
    for file, (now, new) in results_table.expected(ROOT).items():
        assert now == new, f"{file}: run python benchmarks/results_table.py"


def test_benchmarks_shows_every_row_and_the_readme_a_selection():
    data = results_table.load(ROOT)
    full = table_of((ROOT / "BENCHMARKS.md").read_text())
    small = table_of((ROOT / "README.md").read_text())
    full_rows = [line for line in full.splitlines() if line.startswith("| ")][1:]  # past the header
    small_rows = [line for line in small.splitlines() if line.startswith("| ")][1:]
    assert len(full_rows) == len(data["rows"])
    assert 0 < len(small_rows) < len(full_rows)
    assert "0.206 [0.181, 0.233]" in full and "0.206 [0.181, 0.233]" not in small  # intervals: BENCHMARKS


def test_the_readme_table_is_compact_and_its_cells_are_the_benchmarks_values():
    """README.md's view prints values only (no interval, no note), short names and bare headers: a table a
    screen holds. Each of its cells is the value of the same cell in BENCHMARKS.md's full table."""
    data = results_table.load(ROOT)
    view = data["views"]["README.md"]
    assert view["cells"] == "value" and data["views"]["BENCHMARKS.md"].get("cells", "full") == "full"
    assert len(view["rows"]) <= 8 and len(view["columns"]) + 2 <= 6  # the model and training columns besides
    small = table_of((ROOT / "README.md").read_text())
    lines = [line for line in small.splitlines() if line.startswith("|")]
    assert all(len(line) <= 160 for line in lines), max(lines, key=len)
    by_id = {row["id"]: row for row in data["rows"]}
    columns = {column["id"]: column for column in data["columns"]}
    header, _, *body = lines
    assert [c.strip() for c in header.strip("|").split("|")][1:-1] == [
        columns[c]["header"] for c in view["columns"]
    ]
    for row_id, line in zip(view["rows"], body, strict=True):
        row = by_id[row_id]
        model, *cells, training = (c.strip() for c in line.strip("|").split("|"))
        assert model == row.get("short", row["model"]) and training == row.get(
            "short_training", row["training"]
        )
        for column, text in zip(view["columns"], cells, strict=True):
            cell = row["cells"].get(column)
            assert text == results_table.cell_text(cell, data["decimals"], "value")
            assert "(" not in text and "[" not in text  # no interval, no note
            if cell:  # the same value as the full cell BENCHMARKS.md prints
                assert results_table.cell_text(cell, data["decimals"]).strip("*").startswith(text.strip("*"))


def test_a_compact_view_prints_the_value_the_short_name_and_the_bare_header():
    data = {
        "decimals": 3,
        "columns": [{"id": "c", "header": "warm", "users": "9 users"}],
        "rows": [
            {
                "id": "r",
                "model": "a long model name",
                "short": "short",
                "training": "60 min + the teacher",
                "short_training": "60 min",
                "cells": {"c": {"value": 0.2, "ci": [0.1, 0.3], "note": "9 users", "bold": True}},
            }
        ],
        "views": {
            "full.md": {"rows": "all", "columns": "all"},
            "small.md": {"rows": ["r"], "columns": ["c"], "cells": "value"},
        },
    }
    assert results_table.render(data, "full.md").splitlines() == [
        "| model | warm (9 users) | training |",
        "|---|---|---|",
        "| a long model name | **0.200 [0.100, 0.300]** (9 users) | 60 min + the teacher |",
    ]
    assert results_table.render(data, "small.md").splitlines() == [
        "| model | warm | training |",
        "|---|---|---|",
        "| short | **0.200** | 60 min |",
    ]


def test_a_view_with_unknown_cells_is_refused(tmp_path):
    root = copy_checkout(tmp_path)
    data = root / results_table.DATA
    data.write_text(data.read_text().replace('"cells": "value"', '"cells": "values"', 1))
    (problem,) = results_table.check(root)
    assert "cells" in problem and "values" in problem


def test_cells_render_as_written():
    cell = {"value": 0.08, "ci": [0.064, 0.097], "bold": True, "note": "351 users"}
    assert results_table.cell_text(cell, 3) == "**0.080 [0.064, 0.097]** (351 users)"
    assert results_table.cell_text(cell, 3, "value") == "**0.080**"
    assert results_table.cell_text({"value": 0}, 3) == "0"  # an integer as written
    assert results_table.cell_text({"value": 0.0}, 3) == "0.000"
    assert results_table.cell_text(None, 3) == ""
    assert results_table.line(["a", "", "", "b"]) == "| a | | | b |"


def test_a_changed_cell_is_caught_and_the_script_writes_it_back(tmp_path, capsys):
    root = copy_checkout(tmp_path)
    readme = root / "README.md"
    readme.write_text(readme.read_text().replace("| **0.206** |", "| **0.207** |", 1))
    problems = results_table.check(root)
    assert len(problems) == 1 and problems[0].startswith("README.md:")
    assert results_table.main(["--check", "--root", str(root)]) == 1
    assert "README.md" in capsys.readouterr().err

    assert results_table.main(["--root", str(root)]) == 0  # rewrites README.md's table
    assert readme.read_text() == (ROOT / "README.md").read_text()
    assert results_table.main(["--check", "--root", str(root)]) == 0


def test_a_changed_figure_in_the_json_flags_both_files(tmp_path):
    root = copy_checkout(tmp_path)
    data = root / results_table.DATA
    data.write_text(data.read_text().replace('"value": 0.206', '"value": 0.207', 1))
    problems = results_table.check(root)
    assert sorted(p.split(":")[0] for p in problems) == ["BENCHMARKS.md", "README.md"]


def test_a_file_without_its_markers_is_named(tmp_path):
    root = copy_checkout(tmp_path)
    bench = root / "BENCHMARKS.md"
    bench.write_text(bench.read_text().replace(results_table.END, ""))
    (problem,) = results_table.check(root)
    assert problem.startswith("BENCHMARKS.md:") and "found 0" in problem
    with pytest.raises(ValueError, match=r"BENCHMARKS\.md"):
        results_table.expected(root)


def test_every_source_is_a_benchmarks_heading():
    headings = {
        line.lstrip("#").strip()
        for line in (ROOT / "BENCHMARKS.md").read_text().splitlines()
        if re.match(r"#+ ", line)
    }
    data = results_table.load(ROOT)
    sources = {row["source"] for row in data["rows"]}
    sources |= {cell["source"] for row in data["rows"] for cell in row["cells"].values() if "source" in cell}
    assert sources and sources <= headings, sorted(sources - headings)
