"""The new-item protocol's logic (``benchmarks/new_item_protocol.py``): the newest items by first interaction
(RecBole timestamps or positions), one scored example per user at untrained positions, the logged pairs
that are never a scored target, the whole histories; the controls of the served rule and the all-users
stratified interval. No model runs."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from benchmarks.new_item_protocol import (
    P_TEXT,
    TEXT_ONLY,
    blended,
    control_lists,
    first_seen,
    full_histories,
    logged_pairs,
    new_item_examples,
    p_text_lists,
    text_knn_beams,
)
from peft_grounded.new_items import NewItemRule
from peft_grounded.sids.catalogue import LeaveOneOut

SEQUENCES = {
    "u1": ("a", "b", "c", "n1"),  # test target new
    "u2": ("a", "b", "n2", "c"),  # validation target new, test old
    "u3": ("a", "n1", "b", "c"),  # new item only in training history: never scored
    "u4": ("a", "b", "n1", "n2"),  # both new: the test target, once
}


def test_new_item_examples_one_per_user_at_untrained_positions():
    split = LeaveOneOut.from_sequences(SEQUENCES)
    new = {"n1", "n2"}
    test = new_item_examples(split, new, 19, "test")
    assert [(u, t) for u, _, t in test] == [("u1", "n1"), ("u4", "n2")]
    both = new_item_examples(split, new, 19, "last-two")
    assert [(u, h, t) for u, h, t in both] == [
        ("u1", ("a", "b", "c"), "n1"),
        ("u2", ("a", "b"), "n2"),  # the history before the validation target: no test item in it
        ("u4", ("a", "b", "n1"), "n2"),
    ]
    assert [h for _, h, _ in new_item_examples(split, new, 1, "test")] == [("c",), ("n1",)]  # capped
    with pytest.raises(ValueError, match="positions='last'"):
        new_item_examples(split, new, 19, "last")


def test_logged_pairs_stop_before_the_scored_position():
    split = LeaveOneOut.from_sequences({**SEQUENCES, "u5": ("x", "y", "z")})
    test = logged_pairs(split, "test")  # (history, validation target) of every user
    assert test[0] == (("a", "b"), "c") and test[-1] == (("x",), "y") and len(test) == 5
    last_two = logged_pairs(split, "last-two")  # one earlier; u5's history is too short
    assert last_two == [(("a",), "b"), (("a",), "b"), (("a",), "n1"), (("a",), "b")]
    scored = {(tuple(h), t) for _, h, t in new_item_examples(split, {"n1", "n2"}, 19, "last-two")}
    assert not scored & set(last_two)
    with pytest.raises(ValueError, match="'test' or 'last-two'"):
        logged_pairs(split, "valid")


def test_full_histories_are_the_whole_history_before_each_target():
    split = LeaveOneOut.from_sequences(SEQUENCES)
    examples = new_item_examples(split, {"n1", "n2"}, 1, "last-two")  # prompts show one item
    assert [h for _, h, _ in examples] == [("c",), ("b",), ("n1",)]
    assert full_histories(split, examples) == [("a", "b", "c"), ("a", "b"), ("a", "b", "n1")]


def _catalogue(sequences):
    items = sorted({i for seq in sequences.values() for i in seq} | {"never"})
    return SimpleNamespace(items=items, sequences=sequences)


def test_first_seen_reads_recbole_timestamps(tmp_path):
    (tmp_path / "toy.inter").write_text(
        "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
        "u1\ta\t5\t100\nu1\tb\t4\t300\nu2\tb\t3\t200\nu2\tc\t1\t50\n"
    )
    seen = first_seen(_catalogue({"u1": ("a", "b"), "u2": ("c", "b")}), tmp_path)
    assert seen == {"a": 100.0, "b": 200.0, "c": 50.0, "never": math.inf}
    newest = sorted((i for i in seen if math.isfinite(seen[i])), key=seen.get)[-1:]
    assert newest == ["b"]


def test_first_seen_falls_back_to_positions(tmp_path):
    catalogue = _catalogue({"u1": ("a", "b", "c", "d"), "u2": ("c", "d")})
    seen = first_seen(catalogue, tmp_path / "not-a-folder")
    assert seen == {"a": 0.0, "b": 0.25, "c": 0.0, "d": 0.5, "never": math.inf}
    (tmp_path / "toy.inter").write_text("user_id:token\titem_id:token\nu1\ta\n")  # no timestamp column
    assert first_seen(catalogue, tmp_path) == seen


def test_first_seen_names_a_broken_recbole_file(tmp_path):
    catalogue = _catalogue({"u1": ("a", "b", "c")})
    (tmp_path / "toy.inter").write_text("user_id:token\tmovie:token\ttimestamp:float\nu1\ta\t1\n")
    with pytest.raises(ValueError, match="no item_id column"):
        first_seen(catalogue, tmp_path)
    (tmp_path / "toy.inter").write_text("user_id:token\titem_id:token\ttimestamp:float\nu1\ta\n")
    with pytest.raises(ValueError, match="line 2: 2 cells"):
        first_seen(catalogue, tmp_path)


@pytest.mark.slow
def test_first_seen_of_movielens_uses_its_timestamps():
    from peft_grounded.sids import load_catalogue

    catalogue = load_catalogue("movielens-100k")
    seen = first_seen(catalogue, "movielens-100k")
    assert len(seen) == len(catalogue.items) and all(math.isfinite(v) and v > 8e8 for v in seen.values())


def _toy_mixture():
    from peft_grounded.new_items import SemanticMixture

    rng = np.random.default_rng(0)
    items = [f"o{i}" for i in range(8)] + [f"n{i}" for i in range(4)]
    vectors = rng.normal(size=(len(items), 6))
    vectors[8:] = vectors[:4] + 0.05 * rng.normal(size=(4, 6))  # each new item near one old item
    mixture = SemanticMixture(items, vectors, items[8:], temperature=0.1, weights=np.array([0.0, 2.0, 2.0]))
    return mixture, vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_text_knn_beams_are_a_softmax_over_all_items_without_the_history():
    mixture, unit = _toy_mixture()
    histories = [["o0"], ["o1", "n1"]]
    recs = text_knn_beams(mixture, histories, beams=5)
    assert [len(i) for i in recs.items] == [5, 5]
    assert recs.items[0][0] == "n0"  # the nearest item to o0 is its new twin
    assert "o0" not in recs.items[0] and not {"o1", "n1"} & set(recs.items[1])
    cos = unit @ unit[0]
    logits = np.delete(cos / 0.1, 0)  # history left out
    log_z = np.log(np.exp(logits - logits.max()).sum()) + logits.max()
    assert recs.scores[0][0] == pytest.approx(cos[8] / 0.1 - log_z, rel=1e-5)
    assert recs.scores[0] == sorted(recs.scores[0], reverse=True)


def test_p_text_lists_hold_new_items_only_and_the_controls_are_rows():
    mixture, _ = _toy_mixture()
    histories = [["o0"], ["o1", "n1"], ["o2", "o3"]]
    lists = p_text_lists(mixture, histories, k=3)
    assert lists[0][0] == "n0" and all(set(x) <= set(mixture.new_items) for x in lists)
    assert "n1" not in lists[1] and len(lists[1]) == 3
    controls = control_lists(mixture, histories, k=4, beams=6, mode="share")
    assert set(controls) == {TEXT_ONLY, P_TEXT}
    assert all(len(x) == 4 for x in controls[TEXT_ONLY])
    assert controls[P_TEXT][0][0] == "n0" and "o9" not in controls[P_TEXT][2]


def test_the_served_rule_fills_lists_to_k_when_new_items_run_out():
    from peft_grounded.decoding import Recommendations

    mixture, _ = _toy_mixture()
    histories = [["n0", "n1", "n2"]]  # pi_u high, one new item left
    beams = Recommendations(
        items=[["o1", "o2", "o3", "n3", "o4"]], scores=[[-1.0, -2.0, -3.0, -4.0, -5.0]], k=5, num_beams=5
    )
    (lst,) = NewItemRule(mixture, "toy").apply(beams, histories, k=4).items
    assert len(lst) == 4 and "n3" in lst and not {"n0", "n1", "n2"} & set(lst)


def test_blended_weights_the_groups_and_resamples_within_each():
    """All users as the population holds them: the groups' means weighted by their shares; a group without
    spread adds none to the interval, and the interval holds the value."""
    new, old = np.array([1.0, 0.0, 1.0, 0.0]), np.full(6, 0.5)
    value, low, high = blended(new, old, 0.25, seed=0, rounds=2000)
    assert value == pytest.approx(0.25 * 0.5 + 0.75 * 0.5)
    assert low < value < high and high - low <= 0.25 * 1.0 + 1e-9  # only the new group's 25% can move
    assert blended(new, old, 0.25, seed=0, rounds=2000) == (value, low, high)  # seeded
    constant = blended(np.ones(3), np.zeros(5), 0.1, seed=1, rounds=500)
    assert constant == pytest.approx((0.1, 0.1, 0.1))
