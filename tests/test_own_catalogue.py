"""A user's own catalogue, end to end: the README's pipeline on a JSONL catalogue whose numeric item ids
(``0..15``) are MovieLens-100K ids too, with ``--catalogue`` given to ``build-sids`` only. Every later stage
reads the index's own catalogue (checked by the users it trains, scores and fuses on, and the titles it
shows); a catalogue that is not the index's is refused before anything is written; a catalogue that moved
with its index is found again, one that moved alone is named where it was."""

from __future__ import annotations

import json
import shutil

import pytest
from helpers.robust_world import refused, run_cli, snapshot
from helpers.toy_catalogue import toy_catalogue

from peft_grounded.sids import SIDIndex
from peft_grounded.sids.catalogue_source import (
    CatalogueMismatchError,
    CatalogueSource,
    fingerprint_interactions,
    fingerprint_items,
    index_catalogue,
)
from peft_grounded.sids.loaders import load_catalogue

TRAIN = ["--max_steps", "2", "--per_device_train_batch_size", "4", "--max_length", "96", "--save_steps", "2"]


def write_jsonl(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def write_shop(folder) -> tuple:
    """The toy catalogue as two JSONL tables (items, interactions) in ``folder``."""
    catalogue = toy_catalogue()
    folder.mkdir(parents=True, exist_ok=True)
    write_jsonl(
        folder / "items.jsonl",
        [
            {"item_id": i, "title": it.title, "categories": list(it.categories)}
            for i, it in catalogue.items.items()
        ],
    )
    write_jsonl(
        folder / "interactions.jsonl",
        [
            {"user_id": u, "item_id": item, "timestamp": t}
            for u, seq in catalogue.sequences.items()
            for t, item in enumerate(seq)
        ],
    )
    return folder / "items.jsonl", folder / "interactions.jsonl"


@pytest.fixture(scope="module")
def shop(tmp_path_factory, smollm2_dir):
    """A user's folder: a tiny base, the JSONL catalogue, and its SID index from `build-sids`."""
    from conftest import build_tiny_model
    from transformers import AutoTokenizer

    from peft_grounded.cli import main

    root = tmp_path_factory.mktemp("shop")
    base = root / "base"
    build_tiny_model("llama", False).save_pretrained(base)
    AutoTokenizer.from_pretrained(smollm2_dir).save_pretrained(base)
    items, interactions = write_shop(root / "data")
    argv = ["build-sids", "--catalogue", items, "--interactions", interactions, "--encoder", f"lm:{base}",
            "--codes", "4", "--levels", "2", "--no-progress", "--output_dir", root / "sids"]  # fmt: skip
    assert main([str(a) for a in argv]) == 0
    loaded = load_catalogue(str(items), interactions=str(interactions))
    return {"root": root, "base": base, "items": items, "sids": root / "sids", "catalogue": loaded}


def test_build_sids_records_where_the_catalogue_was_read_and_what_it_held(shop):
    record = SIDIndex.load(shop["sids"]).build_config["catalogue_source"]
    assert record["path"] == str(shop["items"]) and record["options"]["interactions"].endswith(
        "interactions.jsonl"
    )
    assert (record["n_items"], record["n_users"]) == (16, 12)
    assert record["items_fingerprint"] == fingerprint_items(shop["catalogue"])
    assert record["interactions_fingerprint"] == fingerprint_interactions(shop["catalogue"])
    assert record["relative_path"] == "../data/items.jsonl"


def test_the_readme_pipeline_reads_the_index_catalogue_at_every_stage(shop, tmp_path, capsys):
    """build-sids (above) -> ground -> sft (distilled: its SASRec teacher) -> fuse-peer -> evaluate ->
    recommend -> diagnose, no --catalogue after build-sids."""
    base, sids = str(shop["base"]), str(shop["sids"])
    users = len(shop["catalogue"].leave_one_out().users)
    assert users == 12  # MovieLens-100K has 943: a stage reading it would show them
    code, _, _ = run_cli(capsys, "ground", "--sid_index", sids, "--model_name_or_path", base, *TRAIN,
                         "--output_dir", tmp_path / "g")  # fmt: skip
    assert code == 0
    code, _, _ = run_cli(capsys, "sft", "--sid_index", sids, "--model_name_or_path", base, *TRAIN,
                         "--grounded", tmp_path / "g" / "adapter", "--distill_weight", "0.5",
                         "--output_dir", tmp_path / "s")  # fmt: skip
    assert code == 0
    teacher = json.loads((tmp_path / "s" / "teacher" / "sasrec.json").read_text())
    assert sorted(teacher["item_ids"]) == sorted(shop["catalogue"].items)
    adapter = tmp_path / "s" / "adapter"
    code, out, _ = run_cli(capsys, "fuse-peer", "--sid_index", sids, "--adapter", adapter)
    assert code == 0 and f"({users} validation users)" in out
    code, out, err = run_cli(capsys, "evaluate", "--sid_index", sids, "--adapter", adapter,
                             "--output_dir", tmp_path / "e")  # fmt: skip
    assert code == 0 and "constrained beam search" in err  # its decoding shows progress
    metrics = json.loads((tmp_path / "e" / "metrics.json").read_text())
    assert metrics["test"]["all"]["users"] == users and metrics["valid"]["all"]["users"] == users
    code, out, _ = run_cli(
        capsys, "recommend", "--sid_index", sids, "--adapter", adapter, "--history", "1,5,9"
    )
    assert code == 0 and "Story" in out  # the toy catalogue's titles ("The Comedy Story 4"), not MovieLens's
    code, _, _ = run_cli(capsys, "diagnose", "--sid_index", sids, "--adapters", adapter, "--no_vocabulary",
                         "--output_dir", tmp_path / "d")  # fmt: skip
    assert code == 0
    report = (tmp_path / "d" / "report.md").read_text()
    assert "No catalogue" not in report


@pytest.mark.parametrize("stage", ["ground", "sft", "evaluate", "fuse-peer"])
def test_movielens_for_an_index_of_another_catalogue_is_refused_before_anything_is_written(
    shop, tmp_path, capsys, stage
):
    """MovieLens's ids are all ids of this catalogue: refused by the fingerprint, naming both catalogues."""
    before = snapshot(shop["root"])
    out = tmp_path / "out"
    argv = {
        "ground": ["--model_name_or_path", shop["base"], "--output_dir", out],
        "sft": ["--model_name_or_path", shop["base"], "--output_dir", out],
        "evaluate": ["--adapter", tmp_path / "no-adapter", "--output_dir", out],
        "fuse-peer": ["--adapter", tmp_path / "no-adapter"],
    }[stage]
    line = refused(capsys, stage, "--sid_index", shop["sids"], "--catalogue", "movielens-100k", *argv)
    assert "--catalogue movielens-100k is 'ml-100k' (1682 items, 943 users" in line
    assert f"not the one SID index {shop['sids']} was built from" in line
    assert "(16 items, 12 users, fingerprint" in line and f"read from {shop['items']}" in line
    assert "leave --catalogue out" in line and "add-items" not in line  # another catalogue, not a grown one
    assert not out.exists() and snapshot(shop["root"]) == before


def test_the_same_catalogue_given_again_is_accepted(shop):
    index = SIDIndex.load(shop["sids"])
    again = index_catalogue(index, str(shop["items"]))  # interactions: the recorded file
    assert again.sequences == shop["catalogue"].sequences


def test_an_edited_catalogue_is_refused_by_its_fingerprint(shop, tmp_path):
    """Same ids, one interaction fewer: ids alone would pass it."""
    items, interactions = write_shop(tmp_path / "data")
    rows = interactions.read_text().splitlines()
    interactions.write_text("\n".join(rows[:-1]) + "\n")
    index = SIDIndex.load(shop["sids"])
    edited = load_catalogue(str(items), interactions=str(interactions))
    with pytest.raises(
        CatalogueMismatchError, match=r"given \('items'\) is .*12 users.* not the one SID index"
    ):
        index_catalogue(index, edited, flag="catalogue=")


def test_a_catalogue_moved_with_its_index_is_found_again(shop, tmp_path):
    shutil.copytree(shop["root"] / "data", tmp_path / "moved" / "data")
    shutil.copytree(shop["sids"], tmp_path / "moved" / "sids")
    record = json.loads((tmp_path / "moved" / "sids" / "sid_index.json").read_text())
    record["build_config"]["catalogue_source"]["path"] = str(tmp_path / "gone" / "items.jsonl")
    record["build_config"]["catalogue_source"]["options"]["interactions"] = str(
        tmp_path / "gone" / "interactions.jsonl"
    )
    (tmp_path / "moved" / "sids" / "sid_index.json").write_text(json.dumps(record))
    found = index_catalogue(SIDIndex.load(tmp_path / "moved" / "sids"))
    assert found.sequences == shop["catalogue"].sequences


def test_a_catalogue_that_moved_alone_is_named_where_it_was(shop, tmp_path, capsys):
    shutil.copytree(shop["sids"], tmp_path / "sids")
    record = json.loads((tmp_path / "sids" / "sid_index.json").read_text())
    record["build_config"]["catalogue_source"]["path"] = str(tmp_path / "gone" / "items.jsonl")
    (tmp_path / "sids" / "sid_index.json").write_text(json.dumps(record))
    line = refused(capsys, "evaluate", "--sid_index", tmp_path / "sids", "--adapter", tmp_path / "a",
                   "--output_dir", tmp_path / "e")  # fmt: skip
    assert f"{tmp_path / 'gone' / 'items.jsonl'} (not there)" in line
    assert (
        "was built from the catalogue 'items' (16 items, 12 users" in line
        and "Pass it: --catalogue PATH" in line
    )
    assert not (tmp_path / "e").exists()


def test_an_index_of_a_catalogue_object_asks_for_the_catalogue(tmp_path, capsys):
    from helpers.toy_catalogue import toy_index

    toy_index(toy_catalogue()).save(tmp_path / "sids")  # build_sids(Catalogue(...)): no path to read again
    line = refused(capsys, "evaluate", "--sid_index", tmp_path / "sids", "--adapter", tmp_path / "a",
                   "--output_dir", tmp_path / "e")  # fmt: skip
    assert "was built from the catalogue 'toy' (16 items, 12 users" in line
    assert "no path was recorded (built from a Catalogue object, or pulled from the Hub)" in line
    assert "Pass it: --catalogue PATH" in line and not (tmp_path / "e").exists()


def test_an_index_without_a_record_asks_for_the_catalogue(tmp_path):
    from helpers.toy_catalogue import toy_vectors

    from peft_grounded.sids import RQKMeansConfig, index_from_vectors

    catalogue = toy_catalogue()
    index = index_from_vectors(
        toy_vectors(catalogue), list(catalogue.items), RQKMeansConfig(codes_per_level=(4, 4))
    )
    with pytest.raises(
        CatalogueMismatchError, match=r"does not record the catalogue it was built from; pass it "
    ):
        index_catalogue(index)
    assert index_catalogue(index, catalogue) is catalogue  # nothing to check it against: taken as given


def test_a_damaged_record_names_the_index_and_the_fix(shop, tmp_path, capsys):
    shutil.copytree(shop["sids"], tmp_path / "sids")
    record = json.loads((tmp_path / "sids" / "sid_index.json").read_text())
    record["build_config"]["catalogue_source"]["colour"] = "blue"
    (tmp_path / "sids" / "sid_index.json").write_text(json.dumps(record))
    line = refused(capsys, "evaluate", "--sid_index", tmp_path / "sids", "--adapter", tmp_path / "a",
                   "--output_dir", tmp_path / "e")  # fmt: skip
    assert f"{tmp_path / 'sids'}: the catalogue record has unknown fields ['colour']" in line


def test_the_pushed_record_keeps_name_and_fingerprint_but_no_local_path(shop):
    from peft_grounded.hub.push import public_index

    index = SIDIndex.load(shop["sids"])
    pushed = public_index(index).build_config["catalogue_source"]
    assert (
        pushed["path"] is None and pushed["relative_path"] is None and "interactions" not in pushed["options"]
    )
    kept = index.build_config["catalogue_source"]
    assert (pushed["name"], pushed["items_fingerprint"]) == (kept["name"], kept["items_fingerprint"])
    assert str(shop["root"]) not in json.dumps(pushed)
    assert public_index(index).fingerprint() == index.fingerprint()


def test_the_builtin_movielens_is_recorded_by_name(tmp_path):
    source = CatalogueSource.of(toy_catalogue(), "movielens-100k")
    assert source.path == "movielens-100k" and source.with_index_folder(tmp_path).relative_path is None
    assert source.public().path == "movielens-100k"


def test_evaluate_says_what_it_served_on_screen_and_in_its_files(shop, tmp_path, capsys):
    """A fused adapter: the weight, depth and peer fingerprint; --no_peer_fusion: the model alone."""
    base, sids = str(shop["base"]), str(shop["sids"])
    assert run_cli(capsys, "sft", "--sid_index", sids, "--model_name_or_path", base, *TRAIN,
                   "--output_dir", tmp_path / "s")[0] == 0  # fmt: skip
    adapter = tmp_path / "s" / "adapter"
    code, out, _ = run_cli(
        capsys, "evaluate", "--sid_index", sids, "--adapter", adapter, "--output_dir", tmp_path / "e0"
    )
    assert code == 0 and "served: the model's lists alone" in out
    assert run_cli(capsys, "fuse-peer", "--sid_index", sids, "--adapter", adapter, "--weights", "1")[0] == 0
    code, out, _ = run_cli(
        capsys, "evaluate", "--sid_index", sids, "--adapter", adapter, "--output_dir", tmp_path / "e1"
    )
    served = json.loads((tmp_path / "e1" / "metrics.json").read_text())["test"]["decoding"]["served"]
    assert served["lists"] == "fused" and (served["weight"], served["depth"]) == (1.0, 20)
    assert len(served["peer"]) == 16 and served["weight_chosen_on_users"] == 12
    line = f"served: the model's beams fused with a SASRec peer (peer {served['peer']}), log p_model + 1 log p_SASRec"
    assert line in out and line in (tmp_path / "e1" / "metrics.md").read_text()
    code, out, err = run_cli(capsys, "evaluate", "--sid_index", sids, "--adapter", adapter, "--no_peer_fusion",
                           "--output_dir", tmp_path / "e2")  # fmt: skip
    assert code == 0 and "served: the model's lists alone" in out, err
    alone = json.loads((tmp_path / "e2" / "metrics.json").read_text())["valid"]["decoding"]["served"]
    assert alone == {"lists": "model alone"}


def test_a_grown_index_reads_its_build_catalogue_with_the_new_items_added(shop, tmp_path, capsys):
    """add-items records where the new items were read; the grown index's own catalogue is the build's plus
    them, and a catalogue given must hold every item it has."""
    new = tmp_path / "new.jsonl"
    write_jsonl(new, [{"item_id": f"n{i}", "title": f"The New Western Story {i}"} for i in range(3)])
    code, _, _ = run_cli(capsys, "add-items", "--sid_index", shop["sids"], "--catalogue", new,
                         "--encoder", f"lm:{shop['base']}", "--no-progress", "--output_dir", tmp_path / "v2")  # fmt: skip
    assert code == 0
    grown = SIDIndex.load(tmp_path / "v2")
    assert grown.build_config["added_catalogues"][0]["path"] == str(new)
    own = index_catalogue(grown)
    assert set(own.items) == set(grown.item_ids) and own.sequences == shop["catalogue"].sequences
    assert own.items["n1"].title == "The New Western Story 1"
    assert index_catalogue(grown, own) is own  # a catalogue holding every item of a grown index is taken
    assert (
        index_catalogue(grown, shop["catalogue"]).items.keys() == shop["catalogue"].items.keys()
    )  # the build's
    with pytest.raises(CatalogueMismatchError, match="not the one SID index"):
        index_catalogue(grown, load_catalogue("movielens-100k"))
    new.unlink()
    with pytest.raises(CatalogueMismatchError, match=rf"{new} \(not there\)"):
        index_catalogue(grown)
