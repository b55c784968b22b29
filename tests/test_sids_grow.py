"""Growing a SID index: existing SIDs bit for bit, new tokens appended, clear errors, safe files, the CLI."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from helpers.sids_fixtures import ENCODER, growth_vectors, parent_index

from peft_grounded.diagnostics.diagnose import token_frequencies
from peft_grounded.new_items.grow_index import GrowthError, GrowthReport, add_items, add_vectors
from peft_grounded.sids import Item
from peft_grounded.sids.build import token_centroids
from peft_grounded.sids.catalogue import CatalogueError
from peft_grounded.sids.index import JSON_NAME, EncoderMismatchError, IndexFileError, SIDIndex, tensors_path


def test_existing_sids_stay_and_the_token_list_extends_the_parents():
    parent = parent_index()
    old, new = growth_vectors()
    new = np.concatenate([new, np.repeat(old[:1], 12, axis=0)])  # copies of a large group: the level grows
    ids = [f"new{i}" for i in range(len(new))]
    report = GrowthReport()
    child = add_vectors(parent, ids, new, encoder=ENCODER, report=report)
    assert np.array_equal(child.codes[: parent.n_items], parent.codes)  # bit for bit
    assert child.item_ids[: parent.n_items] == parent.item_ids
    assert child.token_strings[: parent.n_tokens] == parent.token_strings
    assert child.codes_per_level[:-1] == parent.codes_per_level[:-1]
    _, groups = np.unique(child.codes[:, :2], axis=0, return_counts=True)
    assert child.codes_per_level[-1] == groups.max() > parent.codes_per_level[-1]  # the level grew
    grown = range(parent.codes_per_level[-1], child.codes_per_level[-1])
    assert report.new_tokens == [f"<c_{k}>" for k in grown] == child.token_strings[parent.n_tokens :]
    assert len({tuple(r) for r in child.codes.tolist()}) == child.n_items  # unique SIDs
    assert np.array_equal(child.codes[parent.n_items :, :2], parent.quantize(new))  # the frozen codebooks
    assert child.parent == parent.fingerprint() and child.lineage == [parent.fingerprint()]
    assert child.fingerprint() != parent.fingerprint()
    assert child.quality["growth"][-1]["n_added"] == len(ids) and child.quality["n_items"] == child.n_items
    assert list(child.item_interactions[parent.n_items :]) == [0] * len(ids)
    # centroids stay exact means of the items under each token (tokens carried by any item)
    exact = token_centroids(
        np.concatenate([old, new]),
        child.codes,
        child.codes_per_level,
        child.codebooks,
        np.zeros((child.n_items, 32)),
    )["items"]
    used = token_frequencies(child) > 0
    np.testing.assert_allclose(child.centroids["items"][used], exact[used], rtol=1e-5, atol=1e-5)
    # the codebook variant keeps the k-means codebooks
    k0 = parent.codes_per_level[0] + parent.codes_per_level[1]
    assert np.array_equal(child.centroids["codebook"][:k0], parent.centroids["codebook"][:k0])
    # a grandchild records the whole lineage
    grand = add_vectors(child, ["g0"], new[:1] + 0.01)
    assert (
        grand.lineage == [parent.fingerprint(), child.fingerprint()] and grand.parent == child.fingerprint()
    )


def test_new_items_of_a_group_get_the_next_codes_best_fitting_first():
    parent = parent_index()
    old, _ = growth_vectors()
    far, near = old[0] + 0.2, old[0] + 0.01
    child = add_vectors(parent, ["far", "near"], np.stack([far, near]))
    size = int((parent.codes[:, :2] == parent.codes[0, :2]).all(1).sum())
    assert child.sid_of("near")[:2] == child.sid_of("far")[:2] == parent.sid_of("old0")[:2]
    assert child.sid_of("near")[-1] == size and child.sid_of("far")[-1] == size + 1


def test_reassign_index_takes_a_free_last_level_code():
    parent = parent_index("reassign", codes=(4, 32))
    _, new = growth_vectors()
    child = add_vectors(parent, [f"n{i}" for i in range(3)], new[:3])
    assert child.token_strings == parent.token_strings  # no new tokens
    assert np.array_equal(child.codes[: parent.n_items], parent.codes)
    taken = {tuple(r) for r in parent.codes.tolist()}
    assert not taken & {tuple(r) for r in child.codes[parent.n_items :].tolist()}


def test_an_index_without_dedup_counts_the_new_collisions():
    parent = parent_index("none")
    old, _ = growth_vectors()
    report = GrowthReport()
    child = add_vectors(parent, ["twin"], old[:1], report=report)  # lands on old0's SID
    assert child.sid_of("twin") == parent.sid_of("old0") and report.unresolved_collisions == 1
    assert child.token_strings == parent.token_strings


def test_bad_batches_are_clear_errors_or_a_report():
    parent = parent_index()
    _, new = growth_vectors()
    with pytest.raises(GrowthError, match=r"already in the index.*old3"):
        add_vectors(parent, ["old3", "x"], new[:2])
    with pytest.raises(GrowthError, match=r"more than once.*'x'"):
        add_vectors(parent, ["x", "x"], new[:2])
    report = GrowthReport()
    child = add_vectors(parent, ["old3", "x", "x", "y"], new[:4], on_problem="skip", report=report)
    assert report.added == ["x", "y"] and report.already_indexed == ["old3"] and report.duplicates == ["x"]
    assert child.item_ids[-2:] == ["x", "y"] and np.array_equal(child.codes[: parent.n_items], parent.codes)
    with pytest.raises(EncoderMismatchError, match="built with encoder 'clusters'"):
        add_vectors(parent, ["z"], new[:1], encoder={"kind": "other", "model": "m", "dim": 32})
    with pytest.raises(EncoderMismatchError, match="do not match the index's 32-d encoder"):
        add_vectors(parent, ["z"], np.zeros((1, 16), dtype=np.float32))
    with pytest.raises(GrowthError, match="NaN"):
        add_vectors(parent, ["z"], np.full((1, 32), np.nan, dtype=np.float32))
    with pytest.raises(CatalogueError, match="no text in the index's template fields"):
        add_items(parent, [Item("e", title="")], vectors=None, encoder=object())
    # Items with vectors go through add_items too (duplicates in a plain list are caught)
    with pytest.raises(GrowthError, match="more than once"):
        add_items(parent, [Item("a", title="A"), Item("a", title="A2")], vectors=new[:2])
    assert add_items(parent, [Item("a", title="A")], vectors=new[:1]).item_ids[-1] == "a"


def test_the_child_saves_beside_the_parent_without_touching_its_files(tmp_path):
    parent = parent_index()
    parent.save(tmp_path / "v1")
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (tmp_path / "v1").iterdir()}
    _, new = growth_vectors()
    child = add_items(
        SIDIndex.load(tmp_path / "v1"), [Item(f"n{i}", title="t") for i in range(3)], vectors=new[:3]
    )
    child.save(tmp_path / "v2")
    after = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (tmp_path / "v1").iterdir()}
    assert before == after
    loaded = SIDIndex.load(tmp_path / "v2")
    assert loaded.parent == parent.fingerprint() and loaded.lineage == [parent.fingerprint()]
    assert loaded.fingerprint() == child.fingerprint() and loaded.item_ids == child.item_ids


def test_an_adapter_of_the_parent_is_told_to_grow():
    parent = parent_index()
    _, new = growth_vectors()
    child = add_vectors(parent, ["n"], new[:1])

    class Config:
        token_strings = None

    with pytest.raises(ValueError, match=r"parent version of this SID index.*grow_adapter"):
        child.check_adapter(Config(), recorded=parent.fingerprint())


def test_added_items_name_what_each_growth_appended():
    parent = parent_index(codes=(8, 8))  # 60 old items, 8 x 8 codes + a disambiguation level
    _, vectors = growth_vectors()
    child = add_vectors(parent, [f"new{i}" for i in range(len(vectors))], vectors, encoder=ENCODER)
    new = child.item_ids[parent.n_items :]
    assert parent.added_items() == [] and child.added_items() == new
    grand = add_vectors(child, ["g0", "g1"], growth_vectors()[1][:2] + 0.01)
    assert grand.added_items() == ["g0", "g1"]  # the last growth
    assert grand.added_items(since=parent.fingerprint()) == [*new, "g0", "g1"]  # every growth since the build
    assert grand.added_items(since=child.fingerprint()) == ["g0", "g1"]
    with pytest.raises(ValueError, match="not an ancestor"):
        grand.added_items(since=grand.fingerprint())


@pytest.mark.parametrize(
    "name", ["../x.safetensors", "/etc/passwd", "sid_index.0123456789abcdef.safetensors/../y"]
)
def test_load_accepts_only_the_content_named_tensor_file(tmp_path, name):
    parent_index().save(tmp_path)
    meta = json.loads((tmp_path / JSON_NAME).read_text())
    meta["tensors"]["file"] = name
    (tmp_path / JSON_NAME).write_text(json.dumps(meta))
    with pytest.raises(IndexFileError, match="names the tensor file"):
        SIDIndex.load(tmp_path)


def test_legacy_tensor_file_name_still_loads(tmp_path):
    parent_index().save(tmp_path)
    path = tensors_path(tmp_path)
    path.rename(tmp_path / "sid_index.safetensors")
    meta = json.loads((tmp_path / JSON_NAME).read_text())
    meta["tensors"]["file"] = "sid_index.safetensors"
    (tmp_path / JSON_NAME).write_text(json.dumps(meta))
    assert SIDIndex.load(tmp_path).n_items == 60


def _topics(ids, n_topics=4):
    topics = ["fountain pen ink", "office desk lamp", "printer toner cartridge", "paper stapler"]
    return {
        i: Item(i, title=f"{topics[k % n_topics]} model {k}", categories=(f"T{k % n_topics}",))
        for k, i in enumerate(ids)
    }


def test_cli_add_items_with_the_index_encoder(tmp_path, capsys):
    from peft_grounded.cli import main
    from peft_grounded.sids import Catalogue, build_sids

    old = _topics([f"o{k}" for k in range(16)])
    build_sids(
        Catalogue("t", old, {"u": ("o1", "o2")}),
        tmp_path / "v1",
        levels=2,
        codes=2,
        text_template="title",
        cache_dir=tmp_path / "cache",
        show_progress=False,
    )
    rows = [{"item_id": f"n{k}", "title": f"printer toner cartridge model {k}"} for k in range(3)]
    rows.append({"item_id": "o3", "title": "already there"})
    new = tmp_path / "new.jsonl"
    new.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    argv = [
        "add-items",
        "--sid-index",
        str(tmp_path / "v1"),
        "--catalogue",
        str(new),
        "--catalogue_format",
        "table",
    ]
    common = ["--cache-dir", str(tmp_path / "cache"), "--no-progress"]
    assert main([*argv, "--output_dir", str(tmp_path / "v1"), *common]) == 2
    assert "parent index's directory" in capsys.readouterr().err
    assert main([*argv, "--output_dir", str(tmp_path / "v2"), *common]) == 2
    assert "already in the index" in capsys.readouterr().err and not (tmp_path / "v2").exists()
    assert main([*argv, "--output_dir", str(tmp_path / "v2"), "--skip-problems", *common]) == 0
    assert "added 3 items" in capsys.readouterr().out
    parent, child = SIDIndex.load(tmp_path / "v1"), SIDIndex.load(tmp_path / "v2")
    assert child.parent == parent.fingerprint() and child.item_ids[-3:] == ["n0", "n1", "n2"]
    assert np.array_equal(child.codes[:16], parent.codes)
    assert child.quality["growth"][-1]["already_indexed"] == ["o3"]
    assert (
        main([*argv, "--output_dir", str(tmp_path / "v2"), "--skip-problems", *common]) == 2
    )  # v2 is there now
    assert "already holds a SID index" in capsys.readouterr().err
    assert main([*argv, "--output_dir", str(tmp_path / "v2"), "--skip-problems", "--overwrite", *common]) == 0
