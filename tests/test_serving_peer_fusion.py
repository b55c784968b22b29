"""The peer fusion stored with an adapter: the product of experts by hand, the weight chosen on validation,
its files (safetensors and JSON, checked), and one route: `fuse-peer` writes it, and `evaluate`,
`GroundedRecommender` (merged or not, or a `save_merged` folder) and `recommend` serve the same fused lists."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from helpers.robust_world import toy_items, write_lcrec
from helpers.serving_fixtures import toy_adapter, write_histories

from peft_grounded.cli import main
from peft_grounded.decoding import SIDTrie
from peft_grounded.decoding.search import Recommendations, model_beams
from peft_grounded.evaluation import EvalSettings
from peft_grounded.evaluation.evaluator import evaluate, evaluate_adapter
from peft_grounded.evaluation.peers import choose_weight
from peft_grounded.serving import GroundedRecommender, top_k_lists
from peft_grounded.serving.peer_fusion import (
    FUSION_FILES,
    PeerFusion,
    PeerFusionError,
    peer_log_probs,
    product_of_experts,
)
from peft_grounded.sids import sasrec
from peft_grounded.sids.sasrec import SASRecConfig, fit_sasrec

K, BEAMS = 5, 8
TINY_SASREC = SASRecConfig(hidden_size=16, max_epochs=3, batch_size=8, seed=1)


def test_product_of_experts_by_hand():
    items = ["a", "b", "c", "d", "e"]
    second = np.log(np.array([0.1, 0.2, 0.3, 0.4, 1e-9]))
    second[4] = -math.inf  # e: in the user's history
    first = {"a": -1.0, "b": -2.0, "e": -0.5}  # the model's beams (e: left out by the second)
    # w = 1: a -1 + log .1 = -3.30, b -2 + log .2 = -3.61, c (floor -2) + log .3 = -3.20, d -2 + log .4 = -2.92
    fused = product_of_experts(first, second, items, 1.0, 10)
    assert [i for i, _ in fused] == ["d", "c", "a", "b"]
    assert fused[0][1] == pytest.approx(-2.0 + math.log(0.4))
    # a small w keeps the first's order, the outsiders at its floor after it
    assert [i for i, _ in product_of_experts(first, second, items, 1e-6, 3)] == ["a", "d", "c"]
    # second's top depth only: with depth 1, c (0.3) is not a candidate
    assert [i for i, _ in product_of_experts(first, second, items, 1.0, 1)] == ["d"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("fusion")
    catalogue, index, adapter = toy_adapter(root, "llama", False, True)
    split = catalogue.leave_one_out()
    peer = fit_sasrec(split, index.item_ids, TINY_SASREC)
    prefix = write_lcrec(
        root / "catalogue", toy_items(), {u: list(s) for u, s in catalogue.sequences.items()}
    )
    return {"root": root, "catalogue": catalogue, "index": index, "adapter": adapter, "split": split,
            "peer": peer, "catalogue_path": str(prefix)}  # fmt: skip


def _beams(world, histories, width=BEAMS):
    recommender = GroundedRecommender.from_pretrained(
        world["adapter"], merge=False, num_beams=BEAMS, peer_fusion=False
    )
    return recommender, model_beams(
        recommender.model, recommender.tokenizer, world["index"], histories, width,
        exclude=histories, **recommender._search(),
    )  # fmt: skip


def test_fused_lists_are_the_product_of_the_beams_and_the_peer(world):
    histories = [[*u.history, u.valid] for u in world["split"].users]
    recommender, beams = _beams(world, histories)
    fusion = PeerFusion(world["peer"], 0.5, world["index"].fingerprint(), depth=6)
    fused = fusion.apply(beams, histories, K)
    log_probs = fusion.peer_log_probs(histories)
    for history, items, scores, row, values, peer in zip(
        histories, fused.items, fused.scores, beams.items, beams.scores, log_probs, strict=True
    ):
        assert len(items) == K and not set(items) & set(history)
        first = dict(zip(row, values, strict=True))
        floor = min(first.values())
        column = {item: c for c, item in enumerate(world["peer"].item_ids)}
        for item, score in zip(items, scores, strict=True):  # each score by hand
            assert score == pytest.approx(first.get(item, floor) + 0.5 * peer[column[item]])
        assert scores == sorted(scores, reverse=True)
    # a candidate restriction (a trie of some items) holds for the fused lists too
    allowed = [str(i) for i in world["index"].item_ids][::2]
    restricted = fusion.apply(beams, histories, 3, SIDTrie({i: recommender.sids[i] for i in allowed}))
    assert all(len(items) == 3 and set(items) <= set(allowed) for items in restricted.items)


def test_the_weight_is_chosen_on_held_out_pairs_with_its_controls(world):
    examples = list(world["split"].valid_examples(None))
    histories, targets = [list(h) for _, h, _ in examples], [t for *_, t in examples]
    _, beams = _beams(world, histories, 10)
    weight, table = choose_weight(world["peer"], beams, histories, targets, weights=[0.1, 1.0, 10.0])
    assert [row["weight"] for row in table] == [None, "peer", 0.1, 1.0, 10.0]
    reference = next(row for row in table if row["weight"] == 1.0)["recall@10_minus_reference"]
    assert reference == {"difference": 0.0, "low": 0.0, "high": 0.0}
    best = max(table[2:], key=lambda r: (r["recall@10"], r["ndcg@10"]))
    assert weight == (best["weight"] if best["recall@10_minus_reference"]["low"] > 0 else 1.0)
    with pytest.raises(PeerFusionError, match="weights are numbers > 0"):
        choose_weight(world["peer"], beams, histories, targets, weights=[0.0])
    with pytest.raises(PeerFusionError, match="reference weight is a number > 0"):
        choose_weight(world["peer"], beams, histories, targets, reference=math.inf)
    with pytest.raises(PeerFusionError, match="one target each"):
        choose_weight(world["peer"], beams, histories, targets[:-1])
    with pytest.raises(PeerFusionError, match="weight is a number > 0"):
        PeerFusion(world["peer"], -1.0, "x")


def _peer_favourites(world):
    """Validation histories, the peer's best item for each (its target here), and beams of three other items
    with far lower model scores for the favourite than for the first beam."""
    examples = list(world["split"].valid_examples(None))
    histories = [list(h) for _, h, _ in examples]
    log_probs = peer_log_probs(world["peer"], histories)
    ids = world["peer"].item_ids
    favourites = [ids[int(np.argmax(row))] for row in log_probs]
    rows = []
    for history, favourite in zip(histories, favourites, strict=True):
        rows.append([i for i in ids if i != favourite and i not in history][:3])
    beams = Recommendations(items=rows, scores=[[0.0, -5.0, -10.0]] * len(rows), k=3, num_beams=3)
    return histories, favourites, beams


def test_a_weight_is_served_over_the_reference_only_when_the_users_tell_them_apart(world):
    histories, favourites, beams = _peer_favourites(world)
    assert len(histories) >= 10
    # every user's target is the peer's favourite: w=100 hits it first, w=0.01 keeps the model's first beam
    weight, table = choose_weight(
        world["peer"], beams, histories, favourites, weights=[0.01, 100.0], reference=0.01, k=1
    )
    rows = {row["weight"]: row for row in table}
    assert rows[0.01]["recall@1"] == 0.0 and rows[100.0]["recall@1"] > 0.5
    assert rows[100.0]["recall@1_minus_reference"]["low"] > 0 and weight == 100.0
    # no user's target is in any list: every weight ties, and the reference is served, listed or not
    nobody = ["not-an-item"] * len(histories)
    weight, table = choose_weight(world["peer"], beams, histories, nobody, weights=[0.01, 100.0], k=1)
    assert weight == 1.0 and [row["weight"] for row in table][2:] == [0.01, 1.0, 100.0]
    # one user of many: the best weight is ahead, but its interval holds 0, so the reference is served
    one = [favourites[0], *nobody[1:]]
    weight, table = choose_weight(
        world["peer"], beams, histories, one, weights=[0.01, 100.0], reference=0.01, k=1
    )
    gap = {row["weight"]: row for row in table}[100.0]["recall@1_minus_reference"]
    assert gap["difference"] > 0 and gap["low"] <= 0 and weight == 0.01


def test_saved_fusion_loads_and_refuses_damage_and_another_index(world, tmp_path):
    fusion = PeerFusion(world["peer"], 2.0, world["index"].fingerprint(), depth=7, fitted_on={"users": 3})
    written = fusion.save(tmp_path)
    assert sorted(p.name for p in written) == sorted(FUSION_FILES)
    assert FUSION_FILES[1:] == (sasrec.CONFIG_FILE, sasrec.WEIGHTS_FILE)  # the names the Hub push copies
    assert not list(tmp_path.glob("*.bin")) and not list(tmp_path.glob("*.pkl"))
    loaded = PeerFusion.load(tmp_path)
    assert (loaded.weight, loaded.depth, loaded.fitted_on) == (2.0, 7, {"users": 3})
    histories = [[*u.history, u.valid] for u in world["split"].users]
    assert np.array_equal(loaded.peer_log_probs(histories), fusion.peer_log_probs(histories))
    loaded.check_index(world["index"], "here")
    assert PeerFusion.load(tmp_path / "nothing") is None

    from peft_grounded.sids import SIDIndex

    other = SIDIndex.load(world["adapter"] / "sid_index")
    other.fingerprint = lambda: "another"  # an index built otherwise
    with pytest.raises(PeerFusionError, match=r"fitted for SID index .* fuse-peer"):
        loaded.check_index(other, "here")
    meta = json.loads((tmp_path / "sasrec.json").read_text())
    meta["best_epoch"] = 99  # another peer's record
    (tmp_path / "sasrec.json").write_text(json.dumps(meta))
    with pytest.raises(PeerFusionError, match=r"not the peer peer_fusion\.json was saved with"):
        PeerFusion.load(tmp_path)
    (tmp_path / "sasrec.json").unlink()
    with pytest.raises(PeerFusionError, match=r"no sasrec\.json"):
        PeerFusion.load(tmp_path)


def test_fuse_peer_writes_what_evaluate_and_recommend_serve(world, tmp_path, capsys):
    import shutil

    adapter = tmp_path / "adapter"
    shutil.copytree(world["adapter"], adapter)
    peer_dir = tmp_path / "peer"
    world["peer"].save(peer_dir)
    argv = ["fuse-peer", "--adapter", str(adapter), "--sid_index", str(adapter / "sid_index"),
            "--catalogue", world["catalogue_path"], "--peer", str(peer_dir), "--num_beams", str(BEAMS),
            "--weights", "0.5", "--reference_weight", "2"]  # fmt: skip
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "the model alone" in out and "the peer alone" in out and "peer fusion: log p_model +" in out
    assert "constrained beam search: 100%" in err  # the validation users' decoding shows its progress
    assert "minus w=2, paired" in out
    fusion = PeerFusion.load(adapter)
    assert fusion.weight in (0.5, 2.0) and fusion.fitted_on["users"] == len(world["split"].users)
    assert fusion.fitted_on["reference"] == 2.0 and [r["weight"] for r in fusion.fitted_on["table"]][2:] == [
        0.5,
        2.0,
    ]

    settings = EvalSettings(ks=[K], num_beams=BEAMS, cold=False, exclude_history=True)
    index, catalogue = world["index"], world["catalogue"]
    fused = evaluate_adapter(str(adapter), index, catalogue, settings, parts=("test",), likelihood=False)
    alone = evaluate_adapter(
        str(adapter), index, catalogue, settings, parts=("test",), likelihood=False, peer_fusion=False
    )
    lists = {r["user"]: r["items"] for r in fused.users["test"]}
    assert lists != {r["user"]: r["items"] for r in alone.users["test"]}

    split = catalogue.leave_one_out()
    users = [u.user_id for u in split.users]
    histories = [[*u.history, u.valid] for u in split.users]
    recommender = GroundedRecommender.from_pretrained(world["adapter"], merge=False, num_beams=BEAMS)
    assert recommender.peer_fusion is None  # the original folder holds none
    route = top_k_lists(
        recommender.model, recommender.tokenizer, index, histories, K, num_beams=BEAMS,
        peer_fusion=fusion, **recommender._search(),
    )  # fmt: skip
    assert dict(zip(users, route.items, strict=True)) == lists
    for merge in (True, False):
        served = GroundedRecommender.from_pretrained(adapter, merge=merge, num_beams=BEAMS)
        assert served.peer_fusion is not None
        out = served.recommend(histories, k=K, users=users)
        assert {r.user: r.items for r in out} == lists
    merged = GroundedRecommender.from_pretrained(adapter, num_beams=BEAMS).save_merged(tmp_path / "merged")
    assert all((merged / name).is_file() for name in FUSION_FILES)
    again = GroundedRecommender.from_pretrained(merged, num_beams=BEAMS).recommend(
        histories, k=K, users=users
    )
    assert {r.user: r.items for r in again} == lists
    requests = write_histories(tmp_path / "users.jsonl", dict(zip(users, histories, strict=True)))
    argv = ["recommend", "--adapter", str(adapter), "--histories", str(requests), "--k", str(K),
            "--num_beams", str(BEAMS), "--output_dir", str(tmp_path / "out")]  # fmt: skip
    assert main(argv) == 0
    lines = [
        json.loads(line) for line in (tmp_path / "out" / "recommendations.jsonl").read_text().splitlines()
    ]
    assert {line["user"]: line["items"] for line in lines} == lists


def test_a_fusion_is_not_served_with_a_new_item_rule_nor_scores_targets(world):
    recommender, _ = _beams(world, [["0"]])
    fusion = PeerFusion(world["peer"], 1.0, world["index"].fingerprint())
    args = (recommender.model, recommender.tokenizer, world["index"], [["0", "1"]], K)
    with pytest.raises(ValueError, match="not served together"):
        top_k_lists(*args, peer_fusion=fusion, new_item_rule=object(), **recommender._search())
    with pytest.raises(ValueError, match="pass peer_fusion=None"):
        top_k_lists(*args, peer_fusion=fusion, targets=[[1, 2, 3]], **recommender._search())
    split = world["split"]
    result = evaluate(
        recommender.model, recommender.tokenizer, split, world["index"], world["catalogue"], recommender.fmt,
        ("test",), EvalSettings(ks=[K], num_beams=BEAMS, cold=False), peer_fusion=fusion,
    )  # fmt: skip
    assert all(len(r["items"]) == K for r in result.users["test"])
    assert all("nll" in r for r in result.users["test"])  # the likelihood is the model's, scored apart


def test_fuse_peer_refuses_bad_settings(world):
    base = [
        "fuse-peer",
        "--adapter",
        str(world["adapter"]),
        "--sid_index",
        str(world["adapter"] / "sid_index"),
    ]
    assert main([*base, "--weights", "0"]) == 2
    assert main([*base, "--depth", "0"]) == 2


def test_fuse_peer_refuses_an_adapter_with_a_new_item_rule(world, tmp_path, capsys):
    import shutil

    adapter = tmp_path / "adapter"
    shutil.copytree(world["adapter"], adapter)
    (adapter / "new_item_rule.json").write_text("{}")
    argv = ["fuse-peer", "--adapter", str(adapter), "--sid_index", str(adapter / "sid_index")]
    assert main(argv) == 2
    assert "holds a new-item rule" in capsys.readouterr().err
    assert not (adapter / "peer_fusion.json").exists()


def test_a_fusion_is_set_on_and_off_a_recommender(world):
    recommender, _ = _beams(world, [["0"]])
    recommender.set_peer_fusion(PeerFusion(world["peer"], 1.0, world["index"].fingerprint()))
    assert recommender.recommend([["0", "1"]], k=K)[0].items
    with pytest.raises(ValueError, match=r"delete peer_fusion\.json, sasrec\.json and sasrec\.safetensors"):
        recommender.fit_new_items([["0", "1", "2"]], choose_beams=False)
    recommender.set_peer_fusion(None)
    assert recommender.peer_fusion is None


def test_a_pushed_fusion_is_served_from_the_hub_and_a_push_without_one_removes_it(
    world, hub_endpoint, tmp_path
):
    import shutil

    from huggingface_hub import HfApi

    from peft_grounded.hub import push_grounded

    adapter = tmp_path / "adapter"
    shutil.copytree(world["adapter"], adapter)
    PeerFusion(world["peer"], 1.0, world["index"].fingerprint()).save(adapter)
    api = HfApi()
    api.create_repo("tester/base", exist_ok=True)
    api.upload_folder(repo_id="tester/base", folder_path=str(world["root"] / "base"))
    facts = {"base_model": "tester/base"}
    push_grounded(str(adapter), "tester/fused", index=world["index"], card_facts=facts)
    assert set(FUSION_FILES) <= set(api.list_repo_files("tester/fused"))
    histories = [["0", "1"], ["3"]]
    local = GroundedRecommender.from_pretrained(adapter, num_beams=BEAMS).recommend(histories, k=K)
    hub = GroundedRecommender.from_pretrained("tester/fused", num_beams=BEAMS)
    assert hub.peer_fusion is not None
    assert [r.items for r in hub.recommend(histories, k=K)] == [r.items for r in local]
    push_grounded(str(world["adapter"]), "tester/fused", index=world["index"], card_facts=facts)
    assert not set(FUSION_FILES) & set(api.list_repo_files("tester/fused"))
    assert GroundedRecommender.from_pretrained("tester/fused", num_beams=BEAMS).peer_fusion is None
