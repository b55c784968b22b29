"""compare_adapters' argument parsing and seed pooling (the model-free parts of the script)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def script():
    from benchmarks import compare_adapters

    return compare_adapters


def test_names_carry_their_seed(script):
    named = script._named(["mean=a", "mean@2=b", "centroid@1=c"])
    assert named == {("mean", 0): Path("a"), ("mean", 2): Path("b"), ("centroid", 1): Path("c")}
    assert [script._label(n, s) for n, s in named] == ["mean", "mean@2", "centroid@1"]  # cache file names
    for bad in (["mean"], ["mean@x=a"], ["=a"], ["mean=a", "mean@0=b"]):
        with pytest.raises(SystemExit):
            script._named(bad)


def test_means_pool_seeds_and_subsets_filter(script):
    seed0 = [{"rank": 0, "constrained_nll": 1.0, "cold": True}, {"rank": None, "constrained_nll": 3.0}]
    seed1 = [{"rank": 15, "constrained_nll": 2.0, "cold": True}, {"rank": 2, "constrained_nll": 4.0}]
    means = script._means([seed0, seed1])
    assert means["recall@10"] == pytest.approx((0.5 + 0.5) / 2)  # one hit in each seed
    assert means["recall@20"] == pytest.approx((0.5 + 1.0) / 2)
    assert means["constrained_nll"] == pytest.approx((2.0 + 3.0) / 2)
    assert script._in(seed0, "all") == seed0 and script._in(seed0, "cold") == seed0[:1]
    assert "| mean | cold | 2 | 1 |" in script._row(
        "mean", "cold", [script._in(seed0, "cold"), script._in(seed1, "cold")]
    )
