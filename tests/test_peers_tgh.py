"""TGH, the transition-graph heuristic peer: its lists on a graph checked by hand (ring 1 by similarity plus
the count bonus, ring 2 after, the text KNN fill, the history left out), only training histories make edges,
bad settings are refused, its log-probabilities and its validation choice rank as its lists do."""

from __future__ import annotations

import math
from dataclasses import asdict

import numpy as np
import pytest
from helpers.toy_catalogue import toy_catalogue, toy_vectors

from peft_grounded.checks import SettingsError
from peft_grounded.evaluation import EvalSettings
from peft_grounded.evaluation.graph_peer import (
    TGHSettings,
    TransitionGraphPeer,
    choose_settings,
    transition_counts,
)
from peft_grounded.evaluation.peers import Recommender, peer_records, peer_results
from peft_grounded.sids import LeaveOneOut

# Angles (degrees) of 2-d text vectors: cosine to "a" is c .866 > e .707 > d .500 > b .174; "f" (10 degrees,
# cosine .985) is the nearest text to "a" but has no training edge; "g" is far.
ANGLES = {"a": 0, "b": 80, "c": 30, "d": 60, "e": 45, "f": 10, "g": 120}
VECTORS = np.array([[math.cos(math.radians(t)), math.sin(math.radians(t))] for t in ANGLES.values()])
# history | validation item, test item. Training edges: e->a, a->b (twice), b->d, a->c, c->e.
SEQUENCES = {
    "u1": ("e", "a", "b", "d", "f", "g"),  # validation f, test g: d->f and f->g are no edges
    "u2": ("a", "b", "c", "f"),  # validation c: b->c is no edge
    "u3": ("a", "c", "e", "g", "b"),  # validation g: e->g is no edge
}


def split() -> LeaveOneOut:
    return LeaveOneOut.from_sequences(SEQUENCES)


def peer(**settings) -> TransitionGraphPeer:
    return TransitionGraphPeer.fit(split(), list(ANGLES), VECTORS * 2.5, TGHSettings(**settings))


def test_only_training_histories_make_edges():
    tgh = peer()
    assert tgh.edges == {("e", "a"): 1, ("a", "b"): 2, ("b", "d"): 1, ("a", "c"): 1, ("c", "e"): 1}
    assert transition_counts([("x", "x", "y")]) == {("x", "y"): 1}  # a repeat adds no edge
    assert tgh.rings("f").tolist() == [0] * 7  # f is only a validation item: no edge, no ring
    assert tgh.rings("a", 3).tolist() == [0, 1, 1, 2, 1, 0, 0]  # a b c d e f g


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        (
            dict(count_bonus=0.0, max_ring=2),
            ["c", "e", "b", "d", "f", "g"],
        ),  # ring 1 by similarity, ring 2, fill
        (
            dict(count_bonus=0.3, max_ring=2),
            ["c", "b", "e", "d", "f", "g"],
        ),  # b: .174 + 2 x .3 = .774 passes e (.707)
        (
            dict(count_bonus=1.0, max_ring=2),
            ["b", "c", "e", "d", "f", "g"],
        ),  # b 2.174 > c 1.866 (one transition) > e
        (dict(count_bonus=0.0, max_ring=1), ["c", "e", "b", "f", "d", "g"]),  # d joins the fill, after f
    ],
)
def test_lists_by_hand(settings, expected):
    tgh = peer(**settings)
    assert tgh.recommend([["a"]], 6) == [expected]
    assert tgh.recommend([["g", "a"]], 6) == [[i for i in expected if i != "g"]]  # history left out
    assert tgh.recommend([["a"]], 3) == [expected[:3]]


def test_cold_last_item_gets_text_knn_and_lists_stay_full():
    tgh = peer(count_bonus=1.0, max_ring=2)
    # u1's test history ends with f, which has no edge: text KNN around f (a .985 > c .940 > e .819 > d
    # .643 > b .342 > g -.342), the history left out; the list holds every item outside the history.
    assert tgh.recommend([["e", "a", "b", "d", "f"]], 5) == [["c", "g"]]
    assert tgh.recommend([["f"]], 6) == [["a", "c", "e", "d", "b", "g"]]
    # around d: ring 1 b, ring 2 a, then the fill by cosine to d: e .966, c .866, f .643, g .500
    assert tgh.recommend([["d"]], 6) == [["b", "a", "e", "c", "f", "g"]]
    # no known item: the items most often a transition's target (b twice; then catalogue order)
    assert tgh.recommend([["zz"], []], 3) == [["b", "a", "c"], ["b", "a", "c"]]


def test_deterministic_and_a_peer():
    first, second = peer(count_bonus=0.3), peer(count_bonus=0.3)
    histories = [list(u.history) for u in split().users] + [["g", "a"], ["f"]]
    assert first.recommend(histories, 6) == second.recommend(histories, 6) == first.recommend(histories, 6)
    assert isinstance(first, Recommender)
    reordered = LeaveOneOut.from_sequences(dict(reversed(SEQUENCES.items())))
    third = TransitionGraphPeer.fit(reordered, list(ANGLES), VECTORS, TGHSettings(count_bonus=0.3))
    assert third.recommend(histories, 6) == first.recommend(histories, 6)


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        (dict(count_bonus=-0.1), "count_bonus"),
        (dict(count_bonus=math.nan), "count_bonus"),
        (dict(count_bonus=True), "count_bonus"),
        (dict(max_ring=0), "max_ring"),
        (dict(max_ring=1.5), "max_ring"),
        (dict(batch_size=0), "batch_size"),
    ],
)
def test_bad_settings_are_refused(settings, match):
    with pytest.raises(SettingsError, match=f"TGHSettings: {match} must be"):
        TGHSettings(**settings)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="one vector per item"):
        TransitionGraphPeer(list(ANGLES), VECTORS[:3], {})
    with pytest.raises(ValueError, match="finite and non-zero"):
        TransitionGraphPeer(list(ANGLES), np.zeros((7, 2)), {})
    with pytest.raises(ValueError, match="not among the peer's items"):
        TransitionGraphPeer(list(ANGLES), VECTORS, {("a", "zz"): 1})
    with pytest.raises(ValueError, match="integers >= 1"):
        TransitionGraphPeer(list(ANGLES), VECTORS, {("a", "b"): 0})
    with pytest.raises(ValueError, match="k must be"):
        peer().recommend([["a"]], 0)


def test_log_probs_rank_as_the_lists():
    tgh = peer(count_bonus=0.3)
    histories = [["g", "a"], ["f"], ["d"]]
    log_probs = tgh.log_probs(histories)
    assert log_probs.shape == (3, 7) and log_probs.dtype == np.float64
    assert np.allclose(np.exp(log_probs).sum(axis=1), 1.0)
    for lp, items in zip(log_probs, tgh.recommend(histories, 7), strict=True):
        assert [tgh.item_ids[c] for c in np.argsort(-lp, kind="stable") if lp[c] > -math.inf] == items
    assert np.isneginf(log_probs[0, [0, 6]]).all()  # the history
    restricted = tgh.log_probs(histories, trie={"a", "b", "c"})
    assert np.isfinite(restricted[2, :3]).all() and np.isneginf(restricted[:, 3:]).all()


def test_the_validation_choice_ranks_as_the_lists():
    catalogue = toy_catalogue(n_items=24, n_users=40)
    data = catalogue.leave_one_out()
    tgh = TransitionGraphPeer.fit(data, catalogue.item_ids, toy_vectors(catalogue))
    bonuses, rings = (0.0, 0.5, 5.0), (1, 2)
    chosen, table = choose_settings(tgh, data, bonuses, rings, k=5)
    assert len(table) == 6 and chosen.batch_size == tgh.settings.batch_size
    settings = EvalSettings(ks=[5], cold=False)
    for row in table:
        candidate = TGHSettings(count_bonus=row["count_bonus"], max_ring=row["max_ring"])
        records = peer_records(tgh.with_settings(candidate), data, ("valid",), settings)
        expected = peer_results(records, settings)["valid"]["all"]
        assert (row["recall@5"], row["ndcg@5"]) == pytest.approx((expected["recall@5"], expected["ndcg@5"]))
    best = max(table, key=lambda r: (r["recall@5"], r["ndcg@5"]))
    assert (chosen.count_bonus, chosen.max_ring) == (best["count_bonus"], best["max_ring"])


class _Index:
    """What run_peers reads of a SID index: its items, fingerprint and text vectors."""

    def __init__(self, catalogue) -> None:
        self.item_ids, self.vectors = catalogue.item_ids, toy_vectors(catalogue)

    def fingerprint(self) -> str:
        return "toy"

    def text_vectors(self, catalogue, encoder=None, *, cache_dir=None, show_progress=False):
        return self.vectors


def test_side_by_side_scores_tgh_beside_the_peers(tmp_path):
    from peft_grounded.pipeline.side_by_side import PEER_LABELS, run_peers

    catalogue = toy_catalogue(n_items=24, n_users=40)
    data = catalogue.leave_one_out()
    settings = EvalSettings(ks=[5], cold=True)
    found = run_peers(catalogue, _Index(catalogue), data, settings, tmp_path, ["knn_last", "tgh"])
    tgh = found["tgh"]
    assert tgh["label"] == PEER_LABELS["tgh"] and len(tgh["validation"]) == 21
    assert [r["user"] for r in tgh["records"]] == [r["user"] for r in found["knn_last"]["records"]]
    graph = TransitionGraphPeer.fit(data, catalogue.item_ids, toy_vectors(catalogue))
    chosen, _ = choose_settings(graph, data)  # on validation Recall@10, all validation users
    assert tgh["chosen"] == asdict(chosen)
    again = run_peers(catalogue, _Index(catalogue), data, settings, tmp_path, ["tgh"])  # read back
    assert again["tgh"]["records"] == tgh["records"]
