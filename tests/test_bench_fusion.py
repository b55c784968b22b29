"""Fusion of the LLM's lists with SASRec's, and its control (two SASRecs), on a planted catalogue."""

from __future__ import annotations

import json
import math

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


def test_overlap_by_hand():
    from benchmarks.bench_fusion import overlap

    first = [{"rank": r} for r in (0, 3, None, 12, None)]
    second = [{"rank": r} for r in (1, None, 2, None, None)]
    assert overlap(first, second) == {"both": 0.2, "first only": 0.2, "second only": 0.2, "either": 0.6}


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    catalogue = planted_catalogue()
    return catalogue.leave_one_out(), list(catalogue.item_ids), tmp_path_factory.mktemp("cache")


def _llm(split, items, part, seed=7):
    """A real recommender's lists and log-probabilities (a third SASRec) as the LLM's records of ``part``."""
    import torch

    fit = shared_fit(split, items, SASRecConfig(**SMALL_SASREC, max_epochs=3, patience=2, seed=seed))
    examples = list(getattr(split, f"{part}_examples")())
    out = {}
    for (user, _, target), scores in zip(
        examples, torch.cat(list(fit.score_batches([list(h) for _, h, _ in examples]))), strict=True
    ):
        lp = torch.log_softmax(scores.double(), -1)
        top = [c for c in lp.argsort(descending=True)[:20].tolist() if lp[c] > -math.inf]
        ranked = [items[c] for c in top]
        rank = ranked.index(target) if target in ranked else None
        out[user] = {
            "user": user,
            "target": target,
            "all": True,
            "cold": False,
            "rank": rank,
            "items": ranked,
            "scores": [float(lp[c]) for c in top],
        }
    return out


def test_arms_on_a_planted_catalogue(planted, monkeypatch):
    from benchmarks import bench_fusion

    split, items, cache = planted
    monkeypatch.setenv("PEFT_GROUNDED_CACHE", str(cache))
    config = SASRecConfig(**SMALL_SASREC, max_epochs=6, patience=2)
    llm = {part: _llm(split, items, part) for part in ("valid", "test")}
    args = bench_fusion.Settings(out="o", valid=["v"], test=["t"], sids=["s"], weights=[0.5, 2.0])
    arms, chosen = bench_fusion.fused_arms(llm, split, items, 3, 103, args, config)
    assert set(chosen) == {"llm*sasrec", "sasrec*sasrec2"} and set(chosen.values()) <= {0.5, 2.0}
    for part in ("valid", "test"):
        assert list(arms[part]) == list(bench_fusion.ARMS[:5]) + list(bench_fusion.ARMS[5:])
        # the SASRec arm is the package's peer route with the same fit
        fit = shared_fit(
            split, items, SASRecConfig(**{**SMALL_SASREC, "max_epochs": 6, "patience": 2, "seed": 3})
        )
        peer = peer_records(fit, split, (part,), EvalSettings(users=None, cold=False, ks=(5, 10)))[part]
        assert {r["user"]: r["rank"] for r in arms[part]["sasrec"]} == {r["user"]: r["rank"] for r in peer}
        assert arms[part]["sasrec2"] != arms[part]["sasrec"]  # seed 103: another fit
        for record, a, b in zip(
            arms[part]["llm+sasrec"], arms[part]["llm"], arms[part]["sasrec"], strict=True
        ):
            assert record["items"] == bench_fusion.reciprocal_rank_fusion([a["items"], b["items"]], 60, 20)
    # the weight kept is the one validation scores best
    w = chosen["llm*sasrec"]
    other = 2.0 if w == 0.5 else 0.5
    args_w, args_other = (
        bench_fusion.Settings(out="o", valid=["v"], test=["t"], sids=["s"], weights=[x]) for x in (w, other)
    )
    kept = bench_fusion._score(
        bench_fusion.fused_arms(llm, split, items, 3, 103, args_w, config)[0]["valid"]["llm*sasrec"]
    )
    lost = bench_fusion._score(
        bench_fusion.fused_arms(llm, split, items, 3, 103, args_other, config)[0]["valid"]["llm*sasrec"]
    )
    assert kept >= lost
    # records whose rank disagrees with their lists are refused, and so are users the split lacks
    wrong = next(u for u, r in llm["test"].items() if r["rank"] is not None and r["rank"] < 10)
    bad = {"valid": llm["valid"], "test": {**llm["test"], wrong: {**llm["test"][wrong], "rank": None}}}
    with pytest.raises(SystemExit, match="disagree with its recorded ranks"):
        bench_fusion.fused_arms(bad, split, items, 3, 103, args, config)
    with pytest.raises(SystemExit, match="not test users"):
        bench_fusion.fused_arms({"test": {"nobody": llm["test"][wrong]}}, split, items, 3, 103, args, config)


def test_settings_and_outputs_are_checked(tmp_path):
    from benchmarks import bench_fusion

    def settings(seeds=(0,), **changes):  # as parse_args settles them: the package's --seeds apart
        given = bench_fusion.Settings(**{"out": "o", "valid": ["v"], "test": ["t"], "sids": ["s"], **changes})
        return bench_fusion.settle(given, list(seeds))

    assert settings(valid=["v", "w"], test=["t", "u"], sids=["s", "r"], seeds=[0, 1]).partners == [100, 101]
    with pytest.raises(
        SystemExit, match="one --valid folder, one --test output and one --sids index per seed"
    ):
        settings(test=["t", "u"])
    with pytest.raises(SystemExit, match="fuse SASRec with itself"):
        settings(partners=[0])
    with pytest.raises(SystemExit, match="one --partners seed per seed"):
        settings(partners=[1, 2])
    with pytest.raises(SystemExit, match="depth >= 10"):
        settings(depth=5)
    with pytest.raises(SystemExit, match="--weights are positive"):
        settings(weights=[1.0, -1.0])
    (tmp_path / "users.json").write_text(json.dumps({"test": [{"user": "u", "rank": 1, "items": ["a"]}]}))
    with pytest.raises(SystemExit, match="hold no lists with scores"):
        bench_fusion.llm_records(tmp_path, "test")
