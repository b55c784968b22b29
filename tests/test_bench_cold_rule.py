"""The cold-item rule of benchmarks/bench_cold_rule.py: the new-item rule over the items trained at most once,
fitted on the validation pairs, mixed into a run's stored test lists."""

from __future__ import annotations

import json

import numpy as np


def _shop(seed: int = 0):
    """30 items with 4-d text vectors; 60 users of 6 items; items 25-29 are bought rarely (cold)."""
    from peft_grounded.sids.catalogue import Catalogue, Item

    rng = np.random.default_rng(seed)
    ids = [f"i{k}" for k in range(30)]
    sequences = {}
    for u in range(60):
        drawn = rng.choice(25, size=6, replace=False)
        test = 25 + u % 5 if u % 3 == 0 else drawn[5]  # the test item: a third of the users' is cold
        sequences[f"u{u}"] = tuple(f"i{k}" for k in [*drawn[:5], test])
    items = {i: Item(i, title=f"item {i}") for i in ids}
    return Catalogue("shop", items, sequences), rng.normal(size=(30, 4)).astype(np.float32)


def test_the_cold_rule_mixes_the_stored_lists(tmp_path):
    from benchmarks import bench_cold_rule as bench
    from peft_grounded.new_items import SemanticMixture
    from peft_grounded.sids import build_sids

    catalogue, text = _shop()
    run = tmp_path / "run"
    build_sids(catalogue, run / "sids", vectors=text, levels=2, codes=4, show_progress=False)
    split = catalogue.leave_one_out()
    counts = split.training_target_counts()
    cold = {i for i in catalogue.item_ids if counts.get(i, 0) <= 1}
    assert cold and len(cold) < 30
    rng = np.random.default_rng(1)
    records = []
    for u in split.users:
        seen = {*u.history, u.valid}
        items = [i for i in rng.permutation(catalogue.item_ids).tolist() if i not in seen and i not in cold][
            :12
        ]
        records.append(
            {
                "user": u.user_id,
                "target": u.test,
                "all": True,
                "cold": u.test in cold,
                "rank": items.index(u.test) if u.test in items else None,
                "items": items,
                "scores": sorted(rng.normal(-5, 1, len(items)).tolist(), reverse=True),
            }
        )
    (run / "strategies" / "centroid-seed0").mkdir(parents=True)
    (run / "strategies" / "centroid-seed0" / "metrics.json").write_text(
        json.dumps({"users": {"test": records}})
    )
    (tmp_path / "adapter").mkdir()
    args = bench.Arguments(runs=[str(run)], k=5, save_rule=str(tmp_path / "adapter"), min_places=1)
    scored = bench.score_run(run, catalogue, text, args)
    stored = bench.NewItemRule.load(tmp_path / "adapter")  # what evaluate and recommend would serve
    assert stored.min_places == 1 and set(stored.new_items) == cold and stored.mode == "share"
    assert scored["cold_items"] == len(cold)
    member, per_user = scored["member"], scored["per_user"]
    assert member["cold"].sum() == sum(r["cold"] for r in records) > 0
    assert not (member["warm"] & member["cold"]).any() and (member["warm"] | member["cold"]).all()
    llm_hits = np.array([r["rank"] is not None and r["rank"] < 5 for r in records], dtype=float)
    np.testing.assert_array_equal(per_user[bench.LLM]["recall"], llm_hits)
    assert per_user[bench.LLM]["recall"][member["cold"]].sum() == 0  # the lists hold no cold item
    # one place reserved: every user's last place is a cold item and the LLM's first four stay in order
    assert per_user[bench.RESERVED]["recall"][member["cold"]].mean() > 0
    reserved = bench.NewItemRule(
        SemanticMixture.fit(
            [str(i) for i in catalogue.item_ids],
            text,
            sorted(cold, key=catalogue.item_ids.index),
            [(tuple(u.history), u.valid) for u in split.users],
        ),
        "",
        "share",
        min_places=1,
    )
    histories = [[*u.history, u.valid] for u in split.users]
    beams = bench.Recommendations(
        items=[r["items"] for r in records], scores=[r["scores"] for r in records], k=12, num_beams=12
    )
    lists = reserved.apply(beams, histories, 5).items
    assert all(
        lst[-1] in cold and lst[:-1] == r["items"][: len(lst) - 1]
        for lst, r in zip(lists, records, strict=True)
    )
    # the cold items by p_text alone list cold items only
    assert per_user[bench.P_TEXT]["recall"][member["warm"]].sum() == 0
