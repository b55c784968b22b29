"""Paired bootstrap intervals: hand-checkable cases, pooling over seeds, speed, and the table."""

from __future__ import annotations

import time

import numpy as np
import pytest

from peft_grounded.evaluation import (
    bootstrap_interval,
    compare_users,
    intervals_table,
    paired_intervals,
    user_values,
)


def _records(ranks, nlls=None, users=None):
    users = users or [f"u{i}" for i in range(len(ranks))]
    nlls = nlls or [1.0] * len(ranks)
    return [
        {"user": u, "target": "x", "all": True, "cold": i % 2 == 0, "rank": r, "constrained_nll": n}
        for i, (u, r, n) in enumerate(zip(users, ranks, nlls, strict=True))
    ]


def test_identical_strategies_give_a_zero_interval_that_holds_zero():
    recs = _records([0, None, 3, 12, None, 1])
    out = paired_intervals([recs], [recs], ["recall@5", "ndcg@10", "constrained_nll"])
    for interval in out.values():
        assert (interval["difference"], interval["low"], interval["high"]) == (0.0, 0.0, 0.0)
        assert interval["holds_zero"]


def test_a_constant_shift_gives_an_interval_at_the_shift():
    rng = np.random.default_rng(1)
    base = rng.normal(8, 1, 50).tolist()
    a, b = _records([None] * 50, [x - 0.5 for x in base]), _records([None] * 50, base)
    interval = paired_intervals([a], [b], ["constrained_nll"])["constrained_nll"]
    assert interval["difference"] == pytest.approx(-0.5)
    assert interval["low"] == pytest.approx(-0.5) and interval["high"] == pytest.approx(-0.5)
    assert not interval["holds_zero"]


def test_known_signs_and_values():
    # every user hit at rank 0 by the strategy, none by the reference: recall@1 difference exactly 1
    hit, miss = _records([0] * 10), _records([None] * 10)
    assert paired_intervals([hit], [miss], ["recall@1"])["recall@1"]["low"] == 1.0
    # ndcg of rank 1 is 1/log2(3)
    assert user_values(_records([1]), "ndcg@5")["u0"] == pytest.approx(1 / np.log2(3))
    assert user_values(_records([7]), "ndcg@5")["u0"] == 0.0
    # a small mixed case: differences (+1, +1, 0, -1): mean 0.25, interval holds 0 with 4 users
    a, b = _records([0, 0, 0, None]), _records([None, None, 0, 0])
    interval = paired_intervals([a], [b], ["recall@1"])["recall@1"]
    assert interval["difference"] == pytest.approx(0.25)
    assert interval["low"] < 0 < interval["high"] and interval["holds_zero"]
    assert interval["low"] >= -1.0 and interval["high"] <= 1.0
    # the cold subset selects users 0 and 2 (differences +1 and 0)
    cold = paired_intervals([a], [b], ["recall@1"], subset="cold")["recall@1"]
    assert cold["users"] == 2 and cold["difference"] == pytest.approx(0.5)


def test_pooling_over_seeds_resamples_within_seed_and_is_seeded():
    d0, d1 = np.ones(30), np.zeros(10)
    out = bootstrap_interval([d0, d1], resamples=2000, seed=3)
    # within-seed resampling keeps each seed's share: every resample's mean is exactly 30/40
    assert out["low"] == pytest.approx(0.75) and out["high"] == pytest.approx(0.75)
    assert out["seeds"] == 2 and out["users"] == 40
    noisy = [np.random.default_rng(s).normal(0.1, 1, 200) for s in range(3)]
    assert bootstrap_interval(noisy, seed=7) == bootstrap_interval(noisy, seed=7)


def test_ten_thousand_resamples_are_fast():
    diffs = [np.random.default_rng(s).integers(-1, 2, 943).astype(float) for s in range(3)]
    t = time.perf_counter()
    out = bootstrap_interval(diffs, resamples=10_000)
    assert time.perf_counter() - t < 2.0  # well under a second on an idle core
    assert out["low"] < out["difference"] < out["high"]


def test_mismatched_users_and_missing_fields_fail_clearly():
    with pytest.raises(ValueError, match="different users"):
        paired_intervals([_records([0, 1])], [_records([0, 1], users=["a", "b"])], ["recall@5"])
    with pytest.raises(ValueError, match="seeds"):
        paired_intervals([_records([0])], [], ["recall@5"])
    with pytest.raises(ValueError, match="no paired users"):
        bootstrap_interval([[]])
    no_rank = [{"user": "u0", "all": True, "constrained_nll": 1.0}]
    with pytest.raises(KeyError, match="ranking=True"):
        user_values(no_rank, "recall@5")


def test_compare_users_rows_and_table():
    runs = {"mean": [_records([None, 2, None])], "centroid": [_records([0, 0, None])]}
    refs = {
        "mean": runs["mean"],
        "popularity": [[r | {"constrained_nll": None} for r in _records([5, 5, 5])]],
    }
    rows = compare_users(runs, refs, ["recall@5", "constrained_nll"], resamples=500)
    pairs = {(r["strategy"], r["reference"], r["metric"]) for r in rows}
    assert ("centroid", "mean", "recall@5") in pairs and ("mean", "mean", "recall@5") not in pairs
    assert ("centroid", "popularity", "constrained_nll") not in pairs  # the reference has no NLL: skipped
    table = intervals_table(rows)
    assert table.startswith("| strategy | vs |") and "centroid | mean | recall@5" in table
    assert "interval holds 0" in table or "better" in table


def test_run_spread_from_repeats_and_the_interval_that_carries_it():
    from peft_grounded.intervals import run_spread

    # two reruns of one recipe land 0.017 apart at each of two seeds: sd = 0.017 / sqrt(2)
    assert run_spread([0.017, -0.017]) == pytest.approx(0.017 / np.sqrt(2))
    assert run_spread([0.0, 0.0]) == 0.0
    with pytest.raises(ValueError, match="at least one pair"):
        run_spread([])
    # constant per-user differences: users alone give a zero-width interval; a training spread of sd
    # widens it to the normal interval of two seeds' mean of N(0, 2 sd^2) draws: +-1.96 * sd
    diffs = [np.full(400, 0.01), np.full(400, 0.01)]
    users_only = bootstrap_interval(diffs)
    assert users_only["high"] - users_only["low"] == pytest.approx(0.0, abs=1e-12)
    sd = 0.012
    both = bootstrap_interval(diffs, run_sd=sd)
    assert both["difference"] == pytest.approx(0.01)
    assert both["run_sd"] == sd
    assert (both["high"] - both["low"]) / 2 == pytest.approx(1.96 * sd, rel=0.05)
    assert both["low"] < 0 < both["high"] and both["holds_zero"]
    rng = np.random.default_rng(3)
    noisy = [rng.normal(0.01, 0.3, 400), rng.normal(0.01, 0.3, 400)]
    narrow, wide = bootstrap_interval(noisy), bootstrap_interval(noisy, run_sd=sd)
    assert wide["high"] - wide["low"] > narrow["high"] - narrow["low"]
    for bad in (-0.01, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="run_sd is a standard deviation"):
            bootstrap_interval(diffs, run_sd=bad)
