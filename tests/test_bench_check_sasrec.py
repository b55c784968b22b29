"""The SASRec cross-check script: our row on a planted catalogue, and the atomic file RecBole reads keeps
our interactions and their order."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from helpers.planted_catalogue import SMALL_SASREC, planted_catalogue

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "check_sasrec.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("check_sasrec", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_our_row_on_a_planted_catalogue(script, capsys):
    catalogue = planted_catalogue()
    row = script.run_ours("planted", {**SMALL_SASREC, "max_epochs": 30, "patience": 3}, catalogue=catalogue)
    assert row["users"] == len(catalogue.sequences)
    assert row["test_recall@10"] >= 0.95
    assert 1 <= row["best_epoch"] <= row["epochs"] <= 30
    assert row["threads"] == 1 and row["minutes"] > 0
    script.print_table([row])
    assert "| planted | ours |" in capsys.readouterr().out


def test_atomic_file_keeps_interactions_and_order(script, tmp_path):
    catalogue = planted_catalogue(n_users=12)
    script._write_atomic(catalogue, tmp_path, "planted")
    lines = (tmp_path / "planted.inter").read_text().splitlines()
    assert lines[0] == "user_id:token\titem_id:token\ttimestamp:float"
    rows: dict[str, list[tuple[float, str]]] = {}
    for line in lines[1:]:
        user, item, stamp = line.split("\t")
        rows.setdefault(user, []).append((float(stamp), item))
    assert {u: tuple(i for _, i in sorted(r)) for u, r in rows.items()} == catalogue.sequences
