"""The side-by-side table: means, paired differences against a reference, the warm/cold subsets, seeds."""

from __future__ import annotations

import pytest

from peft_grounded.pipeline.side_by_side import (
    curve_table,
    peer_curve,
    side_by_side_table,
    strategy_row,
    summarise_rows,
)


def records(hits, cold_users=(), users=None):
    users = users or [f"u{i}" for i in range(len(hits))]
    return [
        {"user": u, "target": f"t{u}", "all": True, "cold": u in cold_users, "rank": 0 if h else None}
        for u, h in zip(users, hits, strict=True)
    ]


def test_means_and_paired_differences():
    rows = {
        "ref": {"label": "Reference", "records": [records([1, 0, 0, 0])], "minutes": 1.0, "threads": 1},
        "new": {"label": "New", "records": [records([1, 1, 1, 0])], "minutes": 2.0, "threads": 2},
    }
    summaries = summarise_rows(rows, "ref", subsets=("all",), resamples=200)
    by_name = {s["name"]: s for s in summaries}
    assert by_name["ref"]["all"]["mean"] == pytest.approx(0.25)
    assert "vs_reference" not in by_name["ref"]["all"]
    diff = by_name["new"]["all"]["vs_reference"]
    assert diff["difference"] == pytest.approx(0.5) and diff["users"] == 4
    table = side_by_side_table(summaries, "ref", subsets=("all",))
    assert "| New | 0.750 [" in table and "+0.500 [" in table and "vs Reference" in table


def test_warm_and_cold_subsets():
    cold = {"tu2", "tu3"}
    recs = records([1, 0, 1, 1], cold_users=("u2", "u3"))
    rows = {"a": {"records": [recs]}, "b": {"records": [records([0, 0, 0, 1], cold_users=("u2", "u3"))]}}
    summaries = summarise_rows(rows, "a", subsets=("warm", "cold"), cold_items=cold, resamples=100)
    a = next(s for s in summaries if s["name"] == "a")
    assert a["warm"]["mean"] == pytest.approx(0.5) and a["warm"]["users"] == 2
    assert a["cold"]["mean"] == pytest.approx(1.0) and a["cold"]["users"] == 2
    with pytest.raises(ValueError, match="cold items"):
        summarise_rows(rows, "a", subsets=("warm",))


def test_a_deterministic_reference_pairs_with_every_seed_and_other_users_are_refused():
    rows = {
        "ref": {"records": [records([0, 0])]},
        "seeded": {"records": [records([1, 0]), records([1, 1])]},
    }
    s = next(x for x in summarise_rows(rows, "ref", subsets=("all",), resamples=100) if x["name"] == "seeded")
    assert s["seeds"] == 2 and s["all"]["vs_reference"]["difference"] == pytest.approx(0.75)
    rows["other"] = {"records": [records([1, 1], users=["x", "y"])]}
    with pytest.raises(ValueError, match="different users"):
        summarise_rows(rows, "ref", subsets=("all",), resamples=10)
    with pytest.raises(ValueError, match="reference"):
        summarise_rows(rows, "missing")


def test_strategy_row_reads_the_runners_records():
    run = {"users": {"test": records([1])}, "timings": {"sft_s": 120.0, "grounding_s": 60.0}, "threads": 1}
    row = strategy_row("centroid", [run, run])
    assert row["minutes"] == pytest.approx(3.0) and len(row["records"]) == 2 and row["threads"] == 1


def test_curve_table_reads_each_budget_from_the_points_before_it():
    curves = {
        "SASRec": [(0.1, 0.10), (0.2, 0.18), (0.3, 0.16), (4.8, 0.20)],  # keeps its best epoch
        "LLM": [(6.0, 0.02), (11.0, 0.03), (29.0, 0.05)],
    }
    table = curve_table(curves, budgets=(0.25, 1, 5, 12, 30, 60), best_so_far=["SASRec"])
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1:] for line in table.splitlines()[2:]}
    assert [c.strip(" |") for c in rows["SASRec"]] == ["0.180", "0.180", "0.200", "—", "—", "—"]
    assert [c.strip(" |") for c in rows["LLM"]] == ["—", "—", "—", "0.030", "0.050", "—"]


def test_peer_curve_reads_the_epochs_a_peer_records():
    epochs = [
        {"epoch": 1, "seconds": 6.0, "valid_recall@10": 0.07},
        {"epoch": 2, "seconds": 12.0, "valid_recall@10": 0.09},
    ]
    assert peer_curve({"epochs": epochs}) == [(0.1, 0.07), (0.2, 0.09)]
    assert peer_curve({"records": []}) == []  # a peer without epochs (popularity, KNN) has no curve
