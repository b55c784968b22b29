"""SASRec peer: learns a planted successor, keeps the best validation epoch, pads without NaN, excludes the
history, round-trips through safetensors, refuses bad settings."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from helpers.planted_catalogue import N_ITEMS, SMALL_SASREC, planted_catalogue

from peft_grounded.evaluation.peers import peer_records, peer_results
from peft_grounded.evaluation.reports import EvalSettings, popularity_users
from peft_grounded.sids.catalogue import Catalogue, Item
from peft_grounded.sids.sasrec import (
    SASRecConfig,
    SASRecModel,
    SASRecRecommender,
    _validate,
    epoch_progress,
    fit_sasrec,
    training_windows,
)
from peft_grounded.sids.sasrec_cache import shared_fit


@pytest.fixture(scope="module")
def planted():
    catalogue = planted_catalogue()
    split = catalogue.leave_one_out()
    model = fit_sasrec(split, catalogue.item_ids, SASRecConfig(**SMALL_SASREC, max_epochs=40, patience=4))
    return catalogue, split, model


def test_learns_a_planted_sequence_far_above_popularity(planted):
    _, split, model = planted
    settings = EvalSettings(ks=(1, 10), cold=False)
    ours = peer_results(peer_records(model, split, ("test",), settings), settings)["test"]["all"]
    popular = peer_results(popularity_users(split, ("test",), settings), settings)["test"]["all"]
    assert ours["users"] == len(split)
    assert ours["recall@1"] >= 0.95
    assert popular["recall@1"] <= 0.15
    assert model.history[-1]["loss"] < model.history[0]["loss"]


def test_keeps_the_best_validation_epoch(planted):
    catalogue, split, model = planted
    values = [h["valid_ndcg@10"] for h in model.history]
    assert model.best_epoch == values.index(max(values)) + 1
    assert model.best_epoch < len(model.history)  # it trained on after the best epoch, then stopped
    assert len(model.history) - model.best_epoch == 4  # patience
    indexed = [model.indices(u.history) for u in split.users]
    again = _validate(model, indexed, [model.indices([u.valid])[0] for u in split.users])
    assert again["valid_ndcg@10"] == pytest.approx(max(values))
    # The kept weights are those of the best epoch: a run stopped there has the very same weights.
    short = fit_sasrec(
        split, catalogue.item_ids, SASRecConfig(**SMALL_SASREC, max_epochs=model.best_epoch, patience=4)
    )
    for name, tensor in model.model.state_dict().items():
        assert torch.equal(tensor, short.model.state_dict()[name]), name
    # ... and training went on after it (the losses of the later epochs come from other weights).
    later = [h["loss"] for h in model.history[model.best_epoch :]]
    assert all(loss != model.history[model.best_epoch - 1]["loss"] for loss in later)


def test_seeded_runs_are_identical_and_other_seeds_differ():
    catalogue = planted_catalogue(n_users=30)
    split = catalogue.leave_one_out()
    runs = [
        fit_sasrec(split, catalogue.item_ids, SASRecConfig(**SMALL_SASREC, max_epochs=2, seed=s))
        for s in (1, 1, 2)
    ]
    losses = [[h["loss"] for h in r.history] for r in runs]
    assert losses[0] == losses[1]
    assert losses[0] != losses[2]


def test_bf16_autocast_trains_and_scores_in_float32():
    catalogue = planted_catalogue(n_users=30)
    split = catalogue.leave_one_out()
    model = fit_sasrec(split, catalogue.item_ids, SASRecConfig(**SMALL_SASREC, max_epochs=3, bf16=True))
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in model.history)
    assert model.history[-1]["loss"] < model.history[0]["loss"]
    assert all(p.dtype == torch.float32 for p in model.model.parameters())
    assert model._item_scores([model.indices(split.users[0].history)]).dtype == torch.float32


def test_training_windows_make_every_position_a_target_once():
    histories = [list(range(1, 24)), [5], [7, 8], list(range(1, 6))]
    windows = training_windows(histories, max_length=4)
    assert all(2 <= len(w) <= 5 for w in windows)
    targets = sorted(t for w in windows for t in w[1:])
    assert targets == sorted([*range(2, 24), 8, *range(2, 6)])


def test_left_padding_gives_finite_scores_and_changes_nothing():
    torch.manual_seed(0)
    model = SASRecModel(20, SASRecConfig(hidden_size=16, max_length=6, num_heads=2)).eval()
    padded = torch.tensor([[0, 0, 0, 0, 0, 3], [0, 0, 4, 5, 6, 7], [1, 2, 3, 4, 5, 6]])
    with torch.no_grad():
        hidden = model(padded)
        assert torch.isfinite(hidden).all()
        assert torch.allclose(model(padded[1:2, 2:])[0, -1], hidden[1, -1], atol=1e-5)
        assert torch.allclose(model(padded[0:1, 5:])[0, -1], hidden[0, -1], atol=1e-5)


def test_short_histories_train_and_score_without_nan():
    sequences = {f"u{u}": tuple(str((u + j) % 9) for j in range(3 + u % 2)) for u in range(20)}
    catalogue = Catalogue("short", {str(i): Item(str(i), title=str(i)) for i in range(9)}, sequences)
    split = catalogue.leave_one_out()
    model = fit_sasrec(split, catalogue.item_ids, SASRecConfig(hidden_size=16, max_length=10, max_epochs=3))
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in model.history)
    assert all(torch.isfinite(p).all() for p in model.model.parameters())
    lists = model.recommend([["3"], [], ["unknown"], ["1", "unknown", "2"]], k=3)
    assert [len(items) for items in lists] == [3, 3, 3, 3]
    assert "3" not in lists[0] and not {"1", "2"} & set(lists[3])
    popular = [i for i, _ in sorted(split.training_target_counts().items(), key=lambda kv: -kv[1])]
    assert lists[1][0] in popular[:2]  # no known item: the most popular training targets


def test_history_items_are_never_recommended(planted):
    _, split, model = planted
    histories = [list(u.history) for u in split.users[:10]]
    for history, items in zip(histories, model.recommend(histories, k=N_ITEMS), strict=True):
        assert not set(history) & set(items)
        assert len(items) == N_ITEMS - len(set(history))  # every other item, each once
        assert len(set(items)) == len(items)


def test_save_load_gives_identical_rankings(planted, tmp_path):
    _, split, model = planted
    model.save(tmp_path / "sasrec")
    loaded = SASRecRecommender.load(tmp_path / "sasrec")
    histories = [[*u.history, u.valid] for u in split.users]
    assert loaded.recommend(histories, k=10) == model.recommend(histories, k=10)
    assert (loaded.best_epoch, loaded.history, loaded.config) == (
        model.best_epoch,
        model.history,
        model.config,
    )
    rows = [model.indices(h) for h in histories]
    assert torch.equal(loaded._item_scores(rows), model._item_scores(rows))


def test_load_refuses_mismatched_or_foreign_files(planted, tmp_path):
    _, _, model = planted
    model.save(tmp_path / "a")
    (tmp_path / "a" / "sasrec.safetensors").write_bytes(b"\0" * 16)
    with pytest.raises(ValueError, match="does not match"):
        SASRecRecommender.load(tmp_path / "a")
    with pytest.raises(FileNotFoundError, match="no saved SASRec"):
        SASRecRecommender.load(tmp_path / "missing")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "sasrec.json").write_text(json.dumps({"format": "other"}))
    (tmp_path / "b" / "sasrec.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="not a saved SASRec"):
        SASRecRecommender.load(tmp_path / "b")


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"hidden_size": 0}, "hidden_size must be an integer >= 1"),
        ({"hidden_size": 64, "num_heads": 3}, "num_heads .3. must divide hidden_size"),
        ({"dropout": 1.0}, "dropout must be in"),
        ({"learning_rate": 0}, "learning_rate must be > 0"),
        ({"weight_decay": -1e-4}, "weight_decay must be >= 0"),
        ({"max_length": 2.5}, "max_length must be an integer"),
        ({"patience": 0}, "patience must be an integer >= 1"),
        ({"max_minutes": 0}, "max_minutes must be > 0 or None"),
        ({"valid_metric": "mrr@10"}, "valid_metric must be one of"),
        ({"valid_users": 0}, "valid_users must be an integer >= 1 or None"),
        ({"threads": 0}, "threads must be an integer >= 1 or None"),
        ({"batch_size": True}, "batch_size must be an integer"),
        ({"bf16": "yes"}, "bf16 must be True or False"),
    ],
)
def test_bad_config_values_are_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        SASRecConfig(**settings)


def test_items_outside_item_ids_are_refused():
    catalogue = planted_catalogue(n_users=10)
    with pytest.raises(ValueError, match="not in item_ids"):
        fit_sasrec(catalogue.leave_one_out(), catalogue.item_ids[:-5], SASRecConfig(max_epochs=1))


def test_validation_user_sample_is_seeded_and_sized():
    catalogue = planted_catalogue(n_users=30)
    split = catalogue.leave_one_out()
    runs = [
        fit_sasrec(
            split, catalogue.item_ids, SASRecConfig(**SMALL_SASREC, max_epochs=1, valid_users=7, seed=3)
        )
        for _ in range(2)
    ]
    without_time = [[{k: v for k, v in h.items() if k != "seconds"} for h in r.history] for r in runs]
    assert without_time[0] == without_time[1]
    # 7 users: every validation value is a multiple of 1/7
    assert round(runs[0].history[0]["valid_recall@10"] * 7, 6) % 1 == 0


def test_a_cached_fit_is_shared_by_equal_data_and_settings_only(planted, tmp_path, monkeypatch):
    catalogue, split, _ = planted
    monkeypatch.setenv("PEFT_GROUNDED_CACHE", str(tmp_path))
    config = SASRecConfig(**SMALL_SASREC, max_epochs=2)
    first = shared_fit(split, catalogue.item_ids, config)
    (saved,) = (tmp_path / "sasrec").iterdir()
    again = shared_fit(split, catalogue.item_ids, replace(config, threads=1))  # threads: same fit
    assert again.history == first.history and again.train_seconds == first.train_seconds
    for name, weight in first.model.state_dict().items():
        assert torch.equal(weight, again.model.state_dict()[name]), name
    assert [p.name for p in (tmp_path / "sasrec").iterdir()] == [saved.name]
    # another seed, other histories, or a time budget: a fit of its own (a budget's is never cached)
    shared_fit(split, catalogue.item_ids, replace(config, seed=1))
    shorter = replace(split, users=split.users[:-1])
    shared_fit(shorter, catalogue.item_ids, config)
    shared_fit(split, catalogue.item_ids, replace(config, max_minutes=5.0))
    assert len(list((tmp_path / "sasrec").iterdir())) == 3
    # a saved fit cut short is refitted, not read
    (saved / "sasrec.safetensors").write_bytes(b"cut")
    refit = shared_fit(split, catalogue.item_ids, config)
    assert refit.history[0]["loss"] == pytest.approx(first.history[0]["loss"])
    assert SASRecRecommender.load(saved).history == refit.history


def test_a_fit_shows_its_epochs_their_validation_recall_and_the_time_left(planted, capsys):
    catalogue, split, _ = planted
    config = SASRecConfig(**SMALL_SASREC, max_epochs=3)
    quiet = fit_sasrec(split, catalogue.item_ids, config)
    assert capsys.readouterr().err == ""  # a library call is quiet unless asked
    model = fit_sasrec(split, catalogue.item_ids, config, show_progress=True)
    err = capsys.readouterr().err
    last = model.history[-1]
    assert f"SASRec: epoch {len(model.history)} of at most 3" in err
    assert f"valid Recall@10 {last['valid_recall@10']:.4f} NDCG@10 {last['valid_ndcg@10']:.4f}" in err
    assert f"best epoch {model.best_epoch}, about " in err and " left]" in err
    # the progress line changes nothing of the fit
    assert [h["loss"] for h in model.history] == [h["loss"] for h in quiet.history]


def test_the_time_left_runs_to_the_stop_patience_would_make_or_the_budget():
    config = SASRecConfig(max_epochs=200, patience=10)
    metrics = {"valid_recall@10": 0.25, "valid_ndcg@10": 0.125}
    # epoch 5 after 10 s (2 s an epoch), 3 epochs without a gain: 7 more epochs unless validation improves
    news = epoch_progress(config, 5, 10.0, metrics, 2, 3)
    assert news == "valid Recall@10 0.2500 NDCG@10 0.1250, best epoch 2, about 00:14 left"
    assert "about 00:04 left" in epoch_progress(replace(config, max_epochs=7), 5, 10.0, metrics, 2, 3)
    assert "about 00:02 left" in epoch_progress(replace(config, max_minutes=0.2), 5, 10.0, metrics, 2, 3)
