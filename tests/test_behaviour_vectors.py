"""Item vectors from behaviour (issue 40, item 1): SASRec's item embeddings, the text-to-behaviour map for
items with few or no interactions, the mix, the index that keeps the map, and no test target read."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from helpers.shop import TEXT_DIM, shop_catalogue

from peft_grounded.checks import SettingsError
from peft_grounded.cli import main
from peft_grounded.new_items.grow_index import add_vectors
from peft_grounded.sids import build_sids
from peft_grounded.sids.behaviour import (
    ItemVectorMap,
    ItemVectorsConfig,
    fit_ridge_map,
    item_vectors,
    training_interactions,
)
from peft_grounded.sids.index import JSON_NAME, EncoderMismatchError, IndexFileError, SIDIndex

FAST = dict(behaviour_epochs=40, behaviour_min_interactions=3)


@pytest.fixture(scope="module")
def shop():
    return shop_catalogue()


@pytest.fixture(scope="module")
def behaviour(shop):
    catalogue, text = shop
    config = ItemVectorsConfig(item_vectors="behaviour", **FAST)
    return item_vectors(catalogue.leave_one_out(), catalogue.item_ids, text, config, seed=0)


@pytest.mark.parametrize(
    "bad, named",
    [
        ({"item_vectors": "sasrec"}, "item_vectors"),
        ({"behaviour_weight": 0}, "behaviour_weight"),
        ({"behaviour_weight": 1.0}, "behaviour_weight"),
        ({"behaviour_min_interactions": 0}, "behaviour_min_interactions"),
        ({"behaviour_ridge": -1.0}, "behaviour_ridge"),
        ({"behaviour_epochs": 0}, "behaviour_epochs"),
        ({"behaviour_epochs": 2.5}, "behaviour_epochs"),
    ],
)
def test_a_bad_setting_is_named(bad, named):
    with pytest.raises(SettingsError, match=named):
        ItemVectorsConfig(**bad)


def test_the_ridge_map_recovers_a_linear_map():
    rng = np.random.default_rng(1)
    text = rng.normal(size=(300, 8)).astype(np.float32)
    truth = rng.normal(size=(8, 3)).astype(np.float32)
    behaviour = text @ truth + np.array([1.0, -2.0, 0.5], np.float32)
    weight, t_mean, b_mean = fit_ridge_map(text, behaviour, 1e-3)
    mapped = ItemVectorMap("behaviour", weight, t_mean, b_mean)
    np.testing.assert_allclose(mapped(text), behaviour, atol=1e-3)
    with pytest.raises(ValueError, match="8-d text"):
        mapped(text[:, :5])


def test_warm_items_keep_sasrecs_vectors_and_unbought_ones_get_the_maps(shop, behaviour):
    catalogue, text = shop
    vectors, vector_map, stats = behaviour
    split = catalogue.leave_one_out()
    counts = training_interactions(split, catalogue.item_ids)
    assert counts[40] == counts[41] == 0 and stats["behaviour_warm_items"] == int((counts >= 3).sum())
    assert vectors.shape == (42, 64) and np.isfinite(vectors).all()
    assert 1 <= stats["behaviour_sasrec_epoch"] <= FAST["behaviour_epochs"]
    # the items without interactions: exactly the map's prediction from their text, same text -> same vector
    np.testing.assert_allclose(vectors[40:], vector_map(text[40:]), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(vectors[40], vectors[41])
    # a warm item's vector is not its text's prediction (it is SASRec's own embedding)
    warm = np.flatnonzero(counts >= 3)
    assert not np.allclose(vectors[warm], vector_map(text[warm]), atol=1e-3)


def test_behaviour_follows_who_bought_what_and_text_does_not(shop, behaviour):
    """Group A and group B are told apart by the behaviour vectors (the nearest warm neighbour is in the
    same group), not by the text vectors, which follow parity."""
    _, text = shop
    vectors = behaviour[0][:40]
    group = np.arange(40) >= 20

    def same_group_neighbour(x):
        x = x - x.mean(0)
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
        sims = x @ x.T
        np.fill_diagonal(sims, -np.inf)
        return float((group[sims.argmax(1)] == group).mean())

    assert same_group_neighbour(vectors) >= 0.9
    assert same_group_neighbour(text[:40]) <= 0.7


def test_the_mix_weights_each_part(shop):
    catalogue, text = shop
    config = ItemVectorsConfig(item_vectors="mix", behaviour_weight=0.3, **FAST)
    vectors, vector_map, _ = item_vectors(catalogue.leave_one_out(), catalogue.item_ids, text, config)
    assert vectors.shape == (42, TEXT_DIM + 64)
    np.testing.assert_allclose((vectors[:, :TEXT_DIM] ** 2).sum(1), 0.7, rtol=1e-4)
    np.testing.assert_allclose((vectors[:, TEXT_DIM:] ** 2).sum(1), 0.3, rtol=1e-4)
    np.testing.assert_allclose(vectors[40:], vector_map(text[40:]), rtol=1e-5, atol=1e-6)


def test_no_test_target_reaches_the_vectors(shop, behaviour):
    """Every user's test item changed to another: the vectors are the same to the bit."""
    catalogue, text = shop
    changed = {
        user: (*items[:-1], "i40" if items[-1] != "i40" else "i41")
        for user, items in catalogue.sequences.items()
    }
    other = replace(catalogue, sequences=changed)
    config = ItemVectorsConfig(item_vectors="behaviour", **FAST)
    again, _, _ = item_vectors(other.leave_one_out(), other.item_ids, text, config, seed=0)
    np.testing.assert_array_equal(again, behaviour[0])


def test_a_behaviour_index_keeps_its_map_and_codes_new_items_from_their_text(shop, tmp_path):
    catalogue, text = shop
    config = ItemVectorsConfig(item_vectors="behaviour", **FAST)
    index = build_sids(
        catalogue,
        tmp_path / "sids",
        vectors=text,
        levels=2,
        codes=4,
        item_vectors=config,
        show_progress=False,
    )
    assert index.dim == 64 and index.build_config["item_vectors"]["item_vectors"] == "behaviour"
    assert 0 < index.quality["behaviour_warm_items"] < 42
    loaded = SIDIndex.load(tmp_path / "sids")
    assert loaded.vector_map is not None and loaded.fingerprint() == index.fingerprint()
    np.testing.assert_array_equal(loaded.vector_map.weight, index.vector_map.weight)
    # the centroid start's rows are the behaviour vectors' means, width 64
    assert loaded.centroids["items"].shape[1] == 64
    # a new item is coded from its text through the map
    new_text = text[:2] + 0.01
    child = add_vectors(loaded, ["n0", "n1"], new_text)
    np.testing.assert_array_equal(child.codes[-2:, :2], loaded.quantize(loaded.vector_map(new_text)))
    assert child.vector_map is loaded.vector_map
    with pytest.raises(EncoderMismatchError, match="12-d encoder"):
        add_vectors(loaded, ["n2"], np.ones((1, 64), np.float32))  # behaviour vectors are not text vectors
    # a tampered record is refused by name
    meta = json.loads((tmp_path / "sids" / JSON_NAME).read_text())
    meta["vector_map"] = {"source": "votes", "behaviour_weight": 0.5}
    (tmp_path / "sids" / JSON_NAME).write_text(json.dumps(meta))
    with pytest.raises(IndexFileError, match="vector_map"):
        SIDIndex.load(tmp_path / "sids")


def test_a_text_index_has_no_map(shop):
    catalogue, text = shop
    index = build_sids(catalogue, vectors=text, levels=2, codes=4, show_progress=False)
    assert index.vector_map is None and "item_vectors" not in index.build_config
    np.testing.assert_array_equal(index.index_vectors(text), text)


@pytest.mark.parametrize("show_progress", [True, False])
def test_the_behaviour_fit_shows_its_epochs_unless_progress_is_off(
    shop, tmp_path, monkeypatch, capsys, show_progress
):
    """``build-sids`` fits SASRec for minutes: the fit shows its epochs, their validation Recall and the time
    left on stderr, as encoding shows its items, and not with ``--no_progress`` (``show_progress=False``)."""
    from peft_grounded.sids.sasrec import SASRecRecommender

    catalogue, text = shop
    monkeypatch.setenv("PEFT_GROUNDED_CACHE", str(tmp_path / "cache"))  # a fit, not an earlier test's
    config = ItemVectorsConfig(item_vectors="behaviour", behaviour_epochs=3, behaviour_min_interactions=3)
    index = build_sids(
        catalogue, vectors=text, levels=2, codes=4, item_vectors=config, show_progress=show_progress
    )
    err = capsys.readouterr().err
    if not show_progress:
        assert "SASRec" not in err
        return
    (fit,) = (tmp_path / "cache" / "sasrec").iterdir()
    sasrec = SASRecRecommender.load(fit)
    assert sasrec.best_epoch == index.quality["behaviour_sasrec_epoch"]
    last = sasrec.history[-1]
    assert f"SASRec: epoch {len(sasrec.history)} of at most 3" in err
    assert f"valid Recall@10 {last['valid_recall@10']:.4f}" in err and " left]" in err


def test_the_cli_refuses_a_bad_weight_before_building(tmp_path, capsys):
    code = main(
        [
            "build-sids",
            "--output_dir",
            str(tmp_path / "s"),
            "--item_vectors",
            "mix",
            "--behaviour_weight",
            "1.5",
        ]
    )
    assert code != 0 and "behaviour_weight" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_the_rule_over_a_behaviour_index_ranks_by_the_items_text(shop, tmp_path):
    """A behaviour index's rule encodes the items' text (the index's encoder and template) rather than using
    the behaviour vectors, which the items it serves only have through the weak text map."""
    import warnings

    from peft_grounded.new_items import NewItemRule, index_vectors, rule_vectors
    from peft_grounded.sids.catalogue import TextTemplate
    from peft_grounded.sids.encoders import encode_texts, load_encoder

    catalogue, text = shop
    config = ItemVectorsConfig(item_vectors="behaviour", **FAST)
    index = build_sids(catalogue, tmp_path / "b", levels=2, codes=4, item_vectors=config, show_progress=False)
    texts = TextTemplate.from_spec(index.text_template).render_all(
        [catalogue.items[i] for i in index.item_ids]
    )
    encoded = encode_texts(texts, load_encoder(None), show_progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_allclose(rule_vectors(index, catalogue), encoded, rtol=1e-5, atol=1e-6)
    with pytest.warns(UserWarning, match="pass the catalogue"):
        fallback = rule_vectors(index)
    assert fallback.shape == (42, 64)
    np.testing.assert_array_equal(fallback, index_vectors(index))
    logged = [list(items) for items in catalogue.sequences.values()]
    rule = NewItemRule.fit(index, logged, new_items=["i40", "i41"], catalogue=catalogue)
    assert rule.mixture.vectors.shape == encoded.shape
    text_index = build_sids(catalogue, vectors=text, levels=2, codes=4, show_progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(rule_vectors(text_index, catalogue), index_vectors(text_index))
