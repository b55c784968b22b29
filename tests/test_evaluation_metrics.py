"""Recall@K and NDCG@K on hand-computed leave-one-out cases."""

from __future__ import annotations

import math

import pytest

from peft_grounded.evaluation import metric_names, ndcg_at_k, ranking_metrics, recall_at_k, target_rank


def ranked(target_rank_: int | None, length: int = 20, target: str = "t") -> list[str]:
    """A list of ``length`` items with ``target`` at 0-based ``target_rank_`` (absent when None)."""
    items = [f"other{i}" for i in range(length)]
    if target_rank_ is not None:
        items[target_rank_] = target
    return items


def test_single_user_metrics():
    predicted = ["a", "b", "t", "c", "d"]
    assert target_rank(predicted, "t") == 2 and target_rank(predicted, "z") is None
    assert recall_at_k(predicted, "t", 2) == 0.0 and recall_at_k(predicted, "t", 3) == 1.0
    assert ndcg_at_k(predicted, "t", 2) == 0.0
    assert ndcg_at_k(predicted, "t", 3) == pytest.approx(0.5)  # 1 / log2(2 + 2)
    assert ndcg_at_k(predicted, "a", 1) == 1.0


def test_mean_over_users_by_hand():
    # Targets at ranks 0, 2, 7, 19 and one miss: five users.
    predictions = [ranked(0), ranked(2), ranked(7), ranked(19), ranked(None)]
    result = ranking_metrics(predictions, ["t"] * 5)
    assert result["users"] == 5
    assert result["recall@1"] == pytest.approx(1 / 5)
    assert result["recall@5"] == pytest.approx(2 / 5)
    assert result["recall@10"] == pytest.approx(3 / 5)
    assert result["recall@20"] == pytest.approx(4 / 5)
    assert result["ndcg@1"] == pytest.approx(1 / 5)
    assert result["ndcg@5"] == pytest.approx((1 + 0.5) / 5)
    assert result["ndcg@10"] == pytest.approx((1 + 0.5 + 1 / math.log2(9)) / 5)
    assert result["ndcg@20"] == pytest.approx((1 + 0.5 + 1 / math.log2(9) + 1 / math.log2(21)) / 5)
    assert list(result) == [*metric_names(), "users"]


def test_items_beyond_the_largest_k_do_not_count():
    result = ranking_metrics([ranked(20, length=25)], ["t"], ks=(5, 20))
    assert result["recall@20"] == 0.0 and result["ndcg@20"] == 0.0


def test_integer_item_ids_and_custom_ks():
    result = ranking_metrics([[3, 1, 2], [1, 2, 3]], [1, 9], ks=(3, 1))
    assert result == {
        "recall@1": 0.0,
        "recall@3": 0.5,
        "ndcg@1": 0.0,
        "ndcg@3": pytest.approx(1 / math.log2(3) / 2),
        "users": 2,
    }


def test_no_users_gives_none():
    assert ranking_metrics([], []) == {**dict.fromkeys(metric_names()), "users": 0}


@pytest.mark.parametrize(
    ("predictions", "targets", "ks", "match"),
    [
        ([ranked(0, length=10)], ["t"], (1, 5, 10, 20), "fewer than K=20"),
        ([["a", "a", "b"]], ["a"], (3,), "repeats"),
        ([["a"], ["b"]], ["a"], (1,), "one per user"),
        ([["a"]], ["a"], (0,), "positive"),
        ([["a"]], ["a"], (), "positive"),
    ],
)
def test_bad_input_is_refused(predictions, targets, ks, match):
    with pytest.raises(ValueError, match=match):
        ranking_metrics(predictions, targets, ks)


def test_a_string_is_not_a_predicted_list():
    with pytest.raises(TypeError, match="list of item ids"):
        ranking_metrics(["abc"], ["a"], ks=(1,))
