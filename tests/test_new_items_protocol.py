"""The new-item protocol's data side (``peft_grounded.evaluation.new_items``): the newest items by first
interaction (RecBole timestamps or positions), one scored example per user at untrained positions, and the
calibration pairs that are never a scored target."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from peft_grounded.evaluation import calibration_pairs, first_seen, new_item_examples
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


def test_calibration_pairs_stop_before_the_scored_position():
    split = LeaveOneOut.from_sequences({**SEQUENCES, "u5": ("x", "y", "z")})
    test = calibration_pairs(split, "test")  # (history, validation target) of every user
    assert test[0] == (("a", "b"), "c") and test[-1] == (("x",), "y") and len(test) == 5
    last_two = calibration_pairs(split, "last-two")  # one earlier; u5's history is too short
    assert last_two == [(("a",), "b"), (("a",), "b"), (("a",), "n1"), (("a",), "b")]
    scored = {(tuple(h), t) for _, h, t in new_item_examples(split, {"n1", "n2"}, 19, "last-two")}
    assert not scored & set(last_two)
    with pytest.raises(ValueError, match="'test' or 'last-two'"):
        calibration_pairs(split, "valid")


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
