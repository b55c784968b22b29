"""SASRec fused with the transition graph (benchmarks/bench_graph_expert.py), on a planted catalogue."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers.planted_catalogue import planted_catalogue

from benchmarks.bench_graph_expert import fused_hits, graph_expert, parse_args


def test_fused_hits_by_hand():
    inf = -math.inf
    sasrec = np.log(np.array([[0.5, 0.3, 0.2, 1e-9], [0.1, 0.6, 0.3, 1e-9]]))
    graph = np.log(np.array([[0.1, 0.1, 0.8, 1e-9], [0.25, 0.25, 0.25, 0.25]]))
    sasrec[1, 3] = graph[1, 3] = inf  # user 1's history: never a hit
    targets = np.array([2, 3])
    assert fused_hits(sasrec, graph, targets, 0.0, k=1).tolist() == [False, False]  # item 0 first
    # w = 1: item 2 scores 0.2 * 0.8 = 0.16 against item 0's 0.05 and item 1's 0.03
    assert fused_hits(sasrec, graph, targets, 1.0, k=1).tolist() == [True, False]
    # a tie counts against the target: item 2 ties item 0 at w = log(0.5 / 0.2) / log(8)
    w = math.log(0.5 / 0.2) / math.log(0.8 / 0.1)
    tied = sasrec.copy()
    tied[0, 2] = tied[0, 0] - w * (graph[0, 2] - graph[0, 0])
    assert fused_hits(tied, graph, targets, w, k=1).tolist() == [False, False]
    assert fused_hits(sasrec, graph, targets, 0.0, k=3).tolist() == [True, False]


def test_graph_expert_on_a_planted_catalogue(tmp_path, monkeypatch):
    """The graph is the planted cycle itself: TGH alone hits every warm target, and its interval against SASRec
    is paired per user on the same users as every fused arm."""
    from peft_grounded.sids import build_sids

    monkeypatch.setenv("PEFT_GROUNDED_CACHE", str(tmp_path / "cache"))
    catalogue = planted_catalogue()
    index = build_sids(catalogue, tmp_path / "sids", levels=2, codes=4)  # the packaged text encoder
    result = graph_expert(index, catalogue, [0.5, 2.0])
    for part in ("valid", "test"):
        rows = {r["arm"]: r for r in result["tables"][part]}
        assert list(rows) == ["tgh", "sasrec", "sasrec*tgh 0.5", "sasrec*tgh 2"]
        assert rows["tgh"]["recall@10"] == pytest.approx(1.0)  # the successor is ring 1 with the top count
        assert "minus_sasrec" not in rows["sasrec"]
        for arm in ("tgh", "sasrec*tgh 0.5", "sasrec*tgh 2"):
            span = rows[arm]["minus_sasrec"]
            assert span["users"] == result["users"][part] == len(catalogue.sequences)
            assert span["difference"] == pytest.approx(rows[arm]["recall@10"] - rows["sasrec"]["recall@10"])
    assert result["served_weight"] in (0.0, 0.5, 2.0)
    valid = {r["weight"]: r for r in result["tables"]["valid"]}
    best = max((w for w in valid if w > 0), key=lambda w: valid[w]["recall@10"])
    assert result["served_weight"] == (best if valid[best]["minus_sasrec"]["low"] > 0 else 0.0)


@pytest.mark.parametrize("weights", [["0"], ["-1"], ["nan"]])
def test_bad_graph_weights_are_refused(weights):
    with pytest.raises(SystemExit, match="--graph_weights are positive numbers"):
        parse_args(["--sid_index", "sids", "--graph_weights", *weights])
