"""The peers a shop could run instead: text KNN ranks a planted neighbour first, PEFT's own default path
trains through the same runner, and every peer is scored on the evaluation's own users."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.toy_catalogue import toy_catalogue, toy_index

from peft_grounded.evaluation import EvalSettings, compare_users, popularity_users
from peft_grounded.evaluation.peers import TextKNN, peer_records, peer_results
from peft_grounded.pipeline import Budget, Experiment, run_strategy
from peft_grounded.sids import Catalogue, Item


def planted_knn() -> TextKNN:
    """Five items on a circle; item "b" is the nearest neighbour of "a", "d" of "c"."""
    angles = {"a": 0.0, "b": 0.2, "c": 2.0, "d": 2.3, "e": 4.0}
    vectors = np.array([[np.cos(t), np.sin(t), 0.1] for t in angles.values()], dtype=np.float32)
    return TextKNN(list(angles), vectors * 3.0)  # scale: cosine ignores it


def test_text_knn_ranks_the_planted_neighbour_first_and_never_the_history():
    knn = planted_knn()
    assert knn.recommend([["a"], ["c"]], 2) == [["b", "c"], ["d", "b"]]
    assert knn.recommend([["c", "a"]], 3)[0][0] == "b"  # last item: "a"
    assert knn.recommend([["b", "a"]], 4) == [["c", "e", "d"]]  # history left out, even when k is larger


def test_recency_profile_weighs_the_newest_item_most():
    vectors = np.eye(4, dtype=np.float32) + 0.01
    recency = TextKNN(["w", "x", "y", "z"], vectors, profile="recency", decay=0.5)
    scores = recency.scores([["w", "x"]])[0]
    assert np.isneginf(scores[:2]).all() and scores[2] == pytest.approx(scores[3])
    profile = recency.user_vectors([["w", "x"]])[0]
    assert profile[1] > profile[0] > 0  # x (newest) weighs twice w
    assert recency.name == "text KNN (recency)"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(vectors=np.zeros((5, 3))), "non-zero"),
        (dict(vectors=np.full((5, 3), np.nan)), "finite"),
        (dict(vectors=np.ones((4, 3))), "one vector per item"),
        (dict(profile="mean"), "profile"),
        (dict(decay=0.0), "decay"),
        (dict(window=0), "window"),
    ],
)
def test_text_knn_refuses_bad_input(kwargs, match):
    args = dict(item_ids=list("abcde"), vectors=np.eye(5, 3) + 0.1) | kwargs
    with pytest.raises(ValueError, match=match):
        TextKNN(**args)


def test_peer_records_score_the_same_users_as_the_evaluation():
    catalogue = toy_catalogue(n_items=16, n_users=12)
    split = catalogue.leave_one_out()
    settings = EvalSettings(ks=(1, 5), users=6, seed=3)
    rng = np.random.default_rng(0)
    knn = TextKNN(list(catalogue.items), rng.normal(size=(16, 8)).astype(np.float32))
    records = peer_records(knn, split, ("valid", "test"), settings)
    popularity = popularity_users(split, ("valid", "test"), settings)
    for part in ("valid", "test"):
        assert [(r["user"], r["target"], r["all"], r["cold"]) for r in records[part]] == [
            (r["user"], r["target"], r["all"], r["cold"]) for r in popularity[part]
        ]
    # a test user's history ends with its validation item: it is never recommended back
    lists = knn.recommend([(*u.history, u.valid) for u in split.users], 5)
    assert all(u.valid not in items for u, items in zip(split.users, lists, strict=True))
    results = peer_results(records, settings)
    assert results["test"]["all"]["users"] == 6
    rows = compare_users({"knn": [records["test"]]}, {"popularity": [popularity["test"]]}, ["recall@5"])
    assert rows[0]["users"] == 6


class _Short:
    name = "short"

    def recommend(self, histories, k):
        return [["0"]] * len(histories)


def test_peer_records_refuse_short_lists():
    split = toy_catalogue().leave_one_out()
    with pytest.raises(ValueError, match="fewer than K=5"):
        peer_records(_Short(), split, ("test",), EvalSettings(ks=(1, 5)))


def test_peft_default_path_trains_through_the_runner(model_dir, tmp_path):
    """mean_resizing + PEFT's LoraConfig(trainable_token_indices): same runner, same evaluation users; its
    new rows start at the vocabulary mean and move, the old rows stay."""
    from peft import PeftConfig

    catalogue = toy_catalogue()
    index = toy_index(catalogue)
    budget = Budget.from_training(
        dict(per_device_train_batch_size=4, save_steps=2, logging_steps=1, disable_tqdm=True),
        sft=dict(max_steps=3),
        lora=dict(r=2),
        evaluation=EvalSettings(users=6, num_beams=10, ks=(1, 5, 10)),
    )
    out = tmp_path / "peft_default"
    record = run_strategy("peft_default", Experiment(model_dir, catalogue, index), budget, out)
    assert record["metrics"]["test"]["all"]["users"] == 6
    assert record["metrics"]["test"]["decoding"]["invalid"] == 0
    config = PeftConfig.from_pretrained(str(out / "sft" / "adapter"))
    assert type(config).__name__ == "LoraConfig" and config.trainable_token_indices
    from safetensors.torch import load_file

    saved = load_file(str(out / "sft" / "adapter" / "adapter_model.safetensors"))
    deltas = [v for k, v in saved.items() if "trainable_tokens_delta" in k]
    assert deltas and any(d.abs().sum() > 0 for d in deltas)  # the new rows trained (through the tied head)
    assert any("lora_B" in k and v.abs().sum() > 0 for k, v in saved.items())
    again = run_strategy("peft_default", Experiment(model_dir, catalogue, index), budget, out, resume=True)
    assert again["metrics"] == record["metrics"]


def test_peft_default_rows_start_at_the_vocabulary_mean(model_dir):
    from peft_grounded.sids.extended_base import is_peft_default, peft_default_model

    catalogue = toy_catalogue()
    index = toy_index(catalogue)
    tokenizer, model = peft_default_model(model_dir, index, dict(r=2, target_modules="all-linear"))
    assert is_peft_default(model)
    weight = model.get_input_embeddings()
    ids = tokenizer.convert_tokens_to_ids(index.token_strings)
    table = model.base_model.model.get_input_embeddings().token_adapter.base_layer.weight
    old = table[: min(ids)].float()
    new = torch.stack([weight(torch.tensor([i]))[0] for i in ids]).float()
    assert torch.allclose(new, old.mean(0).expand_as(new), atol=1e-3)
    sid = index.sid_text(index.item_ids[0])
    assert len(tokenizer(sid, add_special_tokens=False)["input_ids"]) == index.n_levels


def test_peer_catalogue_with_unknown_items_is_refused():
    catalogue = Catalogue("c", {"x": Item("x", title="x")}, {})
    index = toy_index(toy_catalogue())
    with pytest.raises(ValueError, match="not in the catalogue"):
        TextKNN.from_index(index, catalogue)


def test_budget_needs_grounding_steps_only_for_strategies_that_ground(model_dir, tmp_path):
    """A budget without grounding steps (or minutes) runs a strategy that does not ground, and is refused,
    before any work, by one that does."""
    from peft_grounded.checks import SettingsError

    catalogue = toy_catalogue()
    index = toy_index(catalogue)
    budget = Budget.from_training(
        dict(per_device_train_batch_size=4, disable_tqdm=True),
        grounding=False,
        sft=dict(max_steps=1),
        lora=dict(r=2),
        evaluation=EvalSettings(users=2, num_beams=10, ks=(1, 5, 10)),
    )
    assert budget.record()["grounding"] is None  # no grounding stage
    with pytest.raises(SettingsError, match="no grounding stage"):
        run_strategy("gti", Experiment(model_dir, catalogue, index), budget, tmp_path / "gti")
    assert not (tmp_path / "gti").exists()
