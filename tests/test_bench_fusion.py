"""Rank fusion of the LLM's lists with SASRec's, and its control (two SASRecs), on a planted catalogue."""

from __future__ import annotations

import json

import pytest
from helpers.planted_catalogue import SMALL_SASREC, planted_catalogue

from peft_grounded.evaluation.peers import peer_records
from peft_grounded.evaluation.reports import EvalSettings
from peft_grounded.sids.sasrec import SASRecConfig
from peft_grounded.sids.sasrec_cache import shared_fit


def test_reciprocal_rank_fusion_by_hand():
    from benchmarks.bench_fusion import reciprocal_rank_fusion

    # k = 0: a 1, b 1/2 + 1, c 1/3, d 1/2
    assert reciprocal_rank_fusion([["a", "b", "c"], ["b", "d"]], 0, 20) == ["b", "a", "d", "c"]
    assert reciprocal_rank_fusion([["a", "b", "c"], ["b", "d"]], 60, 20) == ["b", "a", "d", "c"]
    assert reciprocal_rank_fusion([["a", "b"], ["b", "a"]], 60, 20) == [
        "a",
        "b",
    ]  # a tie: the first list's order
    # each list and the result cut at depth 2: a 1/61, b 1/62, c 1/61 (the second list's first)
    assert reciprocal_rank_fusion([["a", "b", "c"], ["c"]], 60, 2) == ["a", "c"]
    with pytest.raises(ValueError, match="k is >= 0"):
        reciprocal_rank_fusion([["a"]], -1, 20)


def test_arms_on_a_planted_catalogue(tmp_path, monkeypatch, capsys):
    from benchmarks import bench_fusion

    monkeypatch.setenv("PEFT_GROUNDED_CACHE", str(tmp_path / "cache"))
    catalogue = planted_catalogue()
    split = catalogue.leave_one_out()
    items = list(catalogue.item_ids)
    config = SASRecConfig(**SMALL_SASREC, max_epochs=6, patience=2)
    # the "LLM": a real recommender's lists (a third SASRec) in an evaluate output's records
    other = shared_fit(split, items, SASRecConfig(**SMALL_SASREC, max_epochs=3, patience=2, seed=7))
    examples = list(split.test_examples())
    lists = other.recommend([list(h) for _, h, _ in examples], 20)
    llm = {}
    for (user, _, target), ranked in zip(examples, lists, strict=True):
        rank = ranked.index(target) if target in ranked else None
        llm[user] = {
            "user": user,
            "target": target,
            "all": True,
            "cold": False,
            "rank": rank,
            "items": ranked,
        }
    args = bench_fusion.Settings(out=str(tmp_path / "out"), llm=["x"], sids=["x"], seeds=[3])
    arms = bench_fusion.fused_arms(llm, split, items, 3, args, config)
    assert list(arms) == list(bench_fusion.ARMS)
    # the SASRec arm is the package's peer route with the same fit
    peer = peer_records(
        shared_fit(split, items, SASRecConfig(**{**SMALL_SASREC, "max_epochs": 6, "patience": 2, "seed": 3})),
        split,
        ("test",),
        EvalSettings(users=None, cold=False, ks=(5, 10)),
    )["test"]
    assert {r["user"]: r["rank"] for r in arms["sasrec"]} == {r["user"]: r["rank"] for r in peer}
    assert arms["sasrec2"] != arms["sasrec"]  # seed 103: another fit
    for fused, (a, b) in (("llm+sasrec", ("llm", "sasrec")), ("sasrec+sasrec2", ("sasrec", "sasrec2"))):
        for record, ra, rb in zip(arms[fused], arms[a], arms[b], strict=True):
            assert record["items"] == bench_fusion.reciprocal_rank_fusion([ra["items"], rb["items"]], 60, 20)
    # records whose rank disagrees with their lists are refused
    wrong = next(u for u, r in llm.items() if r["rank"] is not None and r["rank"] < 10)
    llm[wrong] = {**llm[wrong], "rank": None}
    with pytest.raises(SystemExit, match="disagree with its recorded ranks"):
        bench_fusion.fused_arms(llm, split, items, 3, args, config)
    with pytest.raises(SystemExit, match="not test users"):
        bench_fusion.fused_arms({"nobody": llm[wrong]}, split, items, 3, args, config)


def test_settings_and_outputs_are_checked(tmp_path):
    from benchmarks import bench_fusion

    with pytest.raises(SystemExit, match="one --llm output and one --sids index per seed"):
        bench_fusion.Settings(out="o", llm=["a", "b"], sids=["s"], seeds=[0, 1])
    with pytest.raises(SystemExit, match="depth >= 10"):
        bench_fusion.Settings(out="o", llm=["a"], sids=["s"], seeds=[0], depth=5)
    with pytest.raises(SystemExit, match="not a peft-grounded evaluate output"):
        bench_fusion.llm_lists(tmp_path, "test")
    (tmp_path / "users.json").write_text(json.dumps({"test": [{"user": "u", "rank": 1}]}))
    with pytest.raises(SystemExit, match="hold no lists"):
        bench_fusion.llm_lists(tmp_path, "test")
