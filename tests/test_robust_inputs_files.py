"""Bad files are refused with one line that names the file and the fix, never a traceback or a silent
wrong result: catalogues (wrong types, bad JSON or bytes, empty, wrong columns, a folder for a file), SID
indices (null or mistyped fields, a tensor file linked from outside the folder), adapters (truncated,
NaN-filled, misshapen, no weights, pickles only, an unknown prompt-format key), base models, an adapter
older than its index, evaluation targets without SIDs; and the user's files stay as they were."""

# ruff: noqa: F811 (the world fixture is imported, then named by the tests)
from __future__ import annotations

import gzip
import json
import os
import shutil

import numpy as np
import pytest
import torch
from helpers.robust_world import (
    build_sids_args,
    copy_adapter,
    data_args,
    refused,
    snapshot,
    toy_items,
    world,  # noqa: F401 (a fixture)
    write_lcrec,
)
from safetensors.torch import load_file, save_file

from peft_grounded.sids.index import JSON_NAME, tensors_path

WEIGHTS = "adapter_model.safetensors"


def refuse_catalogue(capsys, world, tmp_path, catalogue, *extra) -> str:
    out = tmp_path / "sids"
    line = refused(capsys, *build_sids_args(world, catalogue, out, "--no-cache", *extra))
    assert not out.exists()
    return line


# ----------------------------------------------------------------------------------------- catalogues


def test_a_number_for_categories_names_the_file_the_item_and_the_type(world, tmp_path, capsys):
    path = tmp_path / "items.jsonl"
    rows = [{"item_id": "a", "title": "A", "categories": 5}, {"item_id": "b", "title": "B"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    before = path.read_bytes()
    line = refuse_catalogue(capsys, world, tmp_path, path)
    assert str(path) in line and "item 'a'" in line
    assert "categories must be a string or a list of strings, got int 5" in line
    assert path.read_bytes() == before


def test_truncated_lcrec_json_names_the_file_and_the_place(world, tmp_path, capsys):
    prefix = write_lcrec(tmp_path / "cat", toy_items(), {"u": ["0", "1", "2"]})
    item_file = tmp_path / "cat" / "toy.item.json"
    item_file.write_text(item_file.read_text()[:50])
    line = refuse_catalogue(capsys, world, tmp_path, prefix)
    assert str(item_file) in line and "not valid JSON" in line and "line 1" in line


def test_bad_lcrec_interactions_json_names_that_file(world, tmp_path, capsys):
    prefix = write_lcrec(tmp_path / "cat", toy_items(), {})
    inter = tmp_path / "cat" / "toy.inter.json"
    inter.write_text('{"u1": ["0", "1"')
    line = refuse_catalogue(capsys, world, tmp_path, prefix)
    assert str(inter) in line and "not valid JSON" in line


def test_a_latin1_csv_is_refused_as_not_utf8_naming_the_file(world, tmp_path, capsys):
    path = tmp_path / "items.csv"
    path.write_bytes("item_id,title\n1,Caf\u00e9 cr\u00e8me\n2,Pen\n".encode("latin-1"))
    line = refuse_catalogue(capsys, world, tmp_path, path)
    assert str(path) in line and "is not UTF-8 text" in line and "iconv" in line


def test_an_empty_catalogue_file_says_it_has_no_items(world, tmp_path, capsys):
    path = tmp_path / "items.jsonl"
    path.write_text("")
    line = refuse_catalogue(capsys, world, tmp_path, path)
    assert "has no items" in line and "check the path, the format and the column mapping" in line


def test_wrong_column_names_list_the_columns_and_the_mapping_flag(world, tmp_path, capsys):
    path = tmp_path / "items.csv"
    path.write_text("id,name\n1,Pen\n2,Lamp\n")
    line = refuse_catalogue(capsys, world, tmp_path, path)
    assert str(path) in line and "no column ['item_id']" in line and "'id', 'name'" in line
    assert "--item-columns" in line


def test_a_directory_where_the_catalogue_file_is_expected(world, tmp_path, capsys):
    folder = tmp_path / "items.csv"
    folder.mkdir()
    line = refuse_catalogue(capsys, world, tmp_path, folder, "--catalogue_format", "table")
    assert str(folder) in line and "is a directory, where a file was expected" in line


def test_a_truncated_gzip_catalogue_is_named(world, tmp_path, capsys):
    path = tmp_path / "items.jsonl.gz"
    payload = gzip.compress(
        b"".join(json.dumps({"item_id": str(i), "title": f"T{i}"}).encode() + b"\n" for i in range(50))
    )
    path.write_bytes(payload[: len(payload) // 2])
    line = refuse_catalogue(capsys, world, tmp_path, path)
    assert str(path) in line and "cannot be read" in line


def test_an_encoder_path_that_does_not_exist_is_named(world, tmp_path, capsys):
    out = tmp_path / "sids"
    args = build_sids_args(world, world["catalogue"], out, "--no-cache", "--encoder", f"lm:{tmp_path / 'lm'}")
    line = refused(capsys, *args)
    assert (
        f"--encoder lm:{tmp_path / 'lm'}" in line and "is not a directory" in line and "Repo id" not in line
    )
    assert not out.exists()


# ----------------------------------------------------------------------------------------- SID indices


def damaged_index(world, tmp_path, **changes):
    """A copy of the world's index whose JSON has ``changes``."""
    folder = tmp_path / "sids"
    shutil.copytree(world["sids"], folder)
    meta = json.loads((folder / JSON_NAME).read_text())
    meta.update(changes)
    (folder / JSON_NAME).write_text(json.dumps(meta))
    return folder


def refuse_index(capsys, world, tmp_path, folder) -> str:
    args = ["--model_name_or_path", world["base"], "--sid-index", folder, "--catalogue", world["catalogue"]]
    line = refused(capsys, "ground", *args, "--max_steps", "1", "--output_dir", tmp_path / "run")
    assert not (tmp_path / "run").exists()
    return line


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"item_ids": None}, ["'item_ids' must be list, got None"]),
        ({"quality": None}, ["'quality' must be dict, got None"]),
        ({"version": "x"}, ["'version' must be int, got 'x'"]),
        ({"codes_per_level": [4, 0, 16]}, ["'codes_per_level' must be positive integers"]),
        ({"centroid_variants": ["items", "spline"]}, ["unknown variants ['spline']"]),
        ({"disambiguation_level": "yes"}, ["'disambiguation_level' must be bool"]),
    ],
    ids=["item_ids_null", "quality_null", "version_text", "codes_zero", "unknown_centroids", "flag_text"],
)
def test_a_mistyped_index_field_names_the_file_and_the_field(world, tmp_path, capsys, changes, words):
    folder = damaged_index(world, tmp_path, **changes)
    before = snapshot(folder)
    line = refuse_index(capsys, world, tmp_path, folder)
    assert str(folder / JSON_NAME) in line and "build-sids" in line
    for word in words:
        assert word in line, (word, line)
    assert snapshot(folder) == before


def test_truncated_index_json_names_the_file(world, tmp_path, capsys):
    folder = damaged_index(world, tmp_path)
    (folder / JSON_NAME).write_text((folder / JSON_NAME).read_text()[:100])
    line = refuse_index(capsys, world, tmp_path, folder)
    assert str(folder / JSON_NAME) in line and "not valid JSON" in line


def test_a_tensor_file_linked_from_outside_the_index_folder_is_refused(world, tmp_path, capsys):
    folder = damaged_index(world, tmp_path)
    tensors = tensors_path(folder)
    outside = tmp_path / "elsewhere" / tensors.name
    outside.parent.mkdir()
    tensors.rename(outside)
    tensors.symlink_to(outside)  # same bytes, same checksum: only the link gives it away
    line = refuse_index(capsys, world, tmp_path, folder)
    assert f"{tensors} is a link to {outside}, outside the index folder" in line
    assert tensors.is_symlink() and outside.is_file()  # nothing removed or followed into


def test_an_index_json_linked_from_outside_is_refused(world, tmp_path, capsys):
    folder = damaged_index(world, tmp_path)
    outside = tmp_path / "other.json"
    (folder / JSON_NAME).rename(outside)
    (folder / JSON_NAME).symlink_to(outside)
    line = refuse_index(capsys, world, tmp_path, folder)
    assert "outside the index folder" in line


def test_a_link_inside_the_index_folder_is_fine(world, tmp_path):
    from peft_grounded.sids import SIDIndex

    folder = damaged_index(world, tmp_path)
    tensors = tensors_path(folder)
    real = folder / "real.bin"
    tensors.rename(real)
    tensors.symlink_to(real.name)
    assert SIDIndex.load(folder).fingerprint() == SIDIndex.load(world["sids"]).fingerprint()


def test_the_hub_caches_links_from_a_snapshot_to_its_blobs_are_its_own_files(world, tmp_path):
    """huggingface_hub stores ``snapshots/<commit>/<file>`` as links to ``blobs/<hash>``: such an index loads,
    while a link to the blobs of a folder that is no snapshot's is refused."""
    from peft_grounded.sids import SIDIndex
    from peft_grounded.sids.index import IndexFileError

    repo = tmp_path / "models--user--repo"
    snapshot_dir = repo / "snapshots" / "0123abcd" / "sid_index"
    snapshot_dir.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for path in world["sids"].iterdir():
        blob = repo / "blobs" / f"blob-{path.name}"
        shutil.copy(path, blob)
        (snapshot_dir / path.name).symlink_to(os.path.relpath(blob, snapshot_dir))
    assert SIDIndex.load(snapshot_dir).fingerprint() == SIDIndex.load(world["sids"]).fingerprint()
    plain = tmp_path / "plain" / "sid_index"
    shutil.copytree(snapshot_dir, plain, symlinks=False)
    (plain / JSON_NAME).unlink()
    (plain / JSON_NAME).symlink_to(repo / "blobs" / f"blob-{JSON_NAME}")
    with pytest.raises(IndexFileError, match="outside the index folder"):
        SIDIndex.load(plain)


# ----------------------------------------------------------------------------------------- adapters


def refuse_adapter(capsys, world, tmp_path, adapter) -> str:
    args = [*data_args(world), "--adapter", adapter, "--output_dir", tmp_path / "eval"]
    line = refused(capsys, "evaluate", *args, "--users", "2", "--num-beams", "2", "--ks", "1")
    assert not (tmp_path / "eval").exists()
    return line


def test_evaluate_on_a_truncated_adapter_names_the_file(world, tmp_path, capsys):
    adapter = copy_adapter(world, tmp_path)
    weights = adapter / WEIGHTS
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    before = snapshot(adapter)
    line = refuse_adapter(capsys, world, tmp_path, adapter)
    assert f"{weights} cannot be read" in line and "truncated or corrupted" in line
    assert snapshot(adapter) == before


def test_evaluate_on_a_nan_filled_adapter_is_refused(world, tmp_path, capsys):
    adapter = copy_adapter(world, tmp_path)
    tensors = load_file(adapter / WEIGHTS)
    tensors = {k: torch.full_like(v, float("nan")) for k, v in tensors.items()}
    save_file(tensors, adapter / WEIGHTS)
    line = refuse_adapter(capsys, world, tmp_path, adapter)
    assert str(adapter / WEIGHTS) in line and "NaN or Inf" in line


def test_evaluate_on_nan_in_the_lora_alone_is_refused(world, tmp_path, capsys):
    adapter = copy_adapter(world, tmp_path)
    tensors = load_file(adapter / WEIGHTS)
    lora = next(k for k in tensors if "lora_A" in k)
    tensors[lora][0, 0] = float("inf")
    save_file(tensors, adapter / WEIGHTS)
    line = refuse_adapter(capsys, world, tmp_path, adapter)
    assert "NaN or Inf" in line and lora in line


def test_evaluate_on_misshapen_rows_names_both_counts(world, tmp_path, capsys):
    adapter = copy_adapter(world, tmp_path)
    tensors = load_file(adapter / WEIGHTS)
    key = next(k for k in tensors if k.endswith("grounded_embedding"))
    tensors[key] = tensors[key][:-3].clone()
    save_file(tensors, adapter / WEIGHTS)
    line = refuse_adapter(capsys, world, tmp_path, adapter)
    assert "grounded_embedding has shape" in line and "two different saves or are corrupted" in line


def test_evaluate_on_a_lora_of_another_shape_says_which_base_fits(world, tmp_path, capsys):
    adapter = copy_adapter(world, tmp_path)
    tensors = load_file(adapter / WEIGHTS)
    lora = next(k for k in tensors if "lora_A" in k)
    tensors[lora] = torch.zeros(tensors[lora].shape[0], tensors[lora].shape[1] + 8)
    save_file(tensors, adapter / WEIGHTS)
    line = refuse_adapter(capsys, world, tmp_path, adapter)
    assert (
        "does not fit the base model" in line and "size mismatch" in line and "--model_name_or_path" in line
    )


def test_evaluate_on_an_adapter_folder_without_weights(world, tmp_path, capsys):
    adapter = copy_adapter(world, tmp_path)
    (adapter / WEIGHTS).unlink()
    line = refuse_adapter(capsys, world, tmp_path, adapter)
    assert f"{adapter} has adapter_config.json but no {WEIGHTS}" in line
    assert "Repo id" not in line


def test_evaluate_on_pickled_weights_only_says_they_are_never_loaded(world, tmp_path, capsys):
    adapter = copy_adapter(world, tmp_path)
    (adapter / WEIGHTS).rename(adapter / "adapter_model.bin")
    line = refuse_adapter(capsys, world, tmp_path, adapter)
    assert "adapter_model.bin are pickles, never loaded" in line


def test_evaluate_on_a_missing_adapter_folder(world, tmp_path, capsys):
    line = refuse_adapter(capsys, world, tmp_path, tmp_path / "nowhere")
    assert f"no adapter folder {tmp_path / 'nowhere'}" in line and "Repo id" not in line


def test_an_unknown_prompt_format_key_names_the_key_and_the_file(world, tmp_path, capsys):
    adapter = copy_adapter(world, tmp_path)
    record = json.loads((adapter / "sid_record.json").read_text())
    record["prompt_format"] = {**record["prompt_format"], "history_style": "bullets"}
    (adapter / "sid_record.json").write_text(json.dumps(record))
    line = refuse_adapter(capsys, world, tmp_path, adapter)
    assert "prompt_format has keys this peft_grounded does not know: ['history_style']" in line
    assert str(adapter / "sid_record.json") in line and "upgrade peft_grounded" in line


def test_a_corrupted_adapter_config_names_the_file(world, tmp_path, capsys):
    adapter = copy_adapter(world, tmp_path)
    (adapter / "adapter_config.json").write_bytes(b'{"peft_type": "GROUNDED_TOKENS", \xff')
    line = refuse_adapter(capsys, world, tmp_path, adapter)
    assert str(adapter / "adapter_config.json") in line and "not UTF-8 text (byte 33" in line
    (adapter / "adapter_config.json").write_text('{"peft_type": "GROUNDED_TOKENS", ')
    line = refuse_adapter(capsys, world, tmp_path, adapter)
    assert str(adapter / "adapter_config.json") in line and "not valid JSON" in line


def test_an_adapter_of_another_peft_type_is_named(world, tmp_path, capsys):
    adapter = copy_adapter(world, tmp_path)
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps(config | {"peft_type": "LORA"}))
    line = refuse_adapter(capsys, world, tmp_path, adapter)
    assert "holds a LORA adapter, not a grounded-token adapter" in line


def test_diagnose_on_a_truncated_adapter_names_the_file(world, tmp_path, capsys):
    adapter = copy_adapter(world, tmp_path)
    weights = adapter / WEIGHTS
    weights.write_bytes(weights.read_bytes()[:40])
    line = refused(
        capsys,
        "diagnose",
        adapter,
        "--sid-index",
        world["sids"],
        "--no-vocabulary",
        "--output_dir",
        tmp_path / "r",
    )
    assert f"{weights} cannot be read" in line
    assert not (tmp_path / "r").exists()


def test_an_adapter_older_than_its_grown_index_says_grow_it_first(world, tmp_path, capsys):
    from helpers.growth_fixtures import grown_indices

    parent, child = grown_indices()
    from peft_grounded.sids import SIDIndex

    assert parent.fingerprint() == SIDIndex.load(world["sids"]).fingerprint()  # the adapter's index
    child.save(tmp_path / "sids-v2")
    args = [
        "--model_name_or_path",
        world["base"],
        "--sid-index",
        tmp_path / "sids-v2",
        "--catalogue",
        world["catalogue"],
    ]
    line = refused(capsys, "evaluate", *args, "--adapter", world["adapter"], "--output_dir", tmp_path / "e")
    assert "parent version of this SID index" in line
    assert "Grow the adapter first: peft-grounded grow-adapter --adapter ADAPTER" in line
    assert not (tmp_path / "e").exists()


# ----------------------------------------------------------------------------------------- base models


def test_a_missing_model_directory_is_named_not_taken_for_a_repo_id(world, tmp_path, capsys):
    args = [
        "--model_name_or_path",
        "/nonexistent",
        "--sid-index",
        world["sids"],
        "--catalogue",
        world["catalogue"],
    ]
    line = refused(capsys, "ground", *args, "--max_steps", "1", "--output_dir", tmp_path / "g")
    assert "--model_name_or_path /nonexistent: no such directory" in line and "Repo id" not in line
    assert not (tmp_path / "g").exists()


def test_an_adapter_folder_given_as_the_model_says_so(world, tmp_path, capsys):
    args = [
        "--model_name_or_path",
        world["adapter"],
        "--sid-index",
        world["sids"],
        "--catalogue",
        world["catalogue"],
    ]
    line = refused(capsys, "ground", *args, "--max_steps", "1", "--output_dir", tmp_path / "g")
    assert "holds no config.json" in line and "it holds an adapter" in line


def test_a_model_without_safetensors_weights_is_refused(world, tmp_path, capsys):
    model = tmp_path / "model"
    shutil.copytree(world["base"], model, ignore=shutil.ignore_patterns("*.safetensors"))
    args = ["--model_name_or_path", model, "--sid-index", world["sids"], "--catalogue", world["catalogue"]]
    line = refused(capsys, "ground", *args, "--max_steps", "1", "--output_dir", tmp_path / "g")
    assert "holds no *.safetensors weights" in line and "never loaded" in line


# ----------------------------------------------------------------------------------------- evaluation data


def test_an_evaluation_target_missing_from_the_index_is_named_before_decoding(world, tmp_path, capsys):
    items = toy_items() | {"x99": {"title": "Not indexed", "description": "A new film."}}
    sequences = {"u0": ["0", "4", "8", "x99"], "u1": ["1", "5", "9", "13"]}
    prefix = write_lcrec(tmp_path / "cat", items, sequences)
    args = ["--model_name_or_path", world["base"], "--sid-index", world["sids"], "--catalogue", prefix]
    line = refused(capsys, "evaluate", *args, "--adapter", world["adapter"], "--output_dir", tmp_path / "e")
    assert "It holds 1 item the SID index lacks (e.g. ['x99'])" in line and "add-items" in line
    assert not (tmp_path / "e").exists()


def test_a_corrupted_run_manifest_is_named_on_resume(world, tmp_path, capsys):
    run = tmp_path / "run"
    (run / "checkpoint-1").mkdir(parents=True)
    (run / "run.json").write_text('{"stage": "grounding", ')
    (run / "checkpoint-1" / "run.json").write_text('{"stage": "grounding", ')
    before = snapshot(run)
    line = refused(
        capsys,
        "ground",
        *data_args(world),
        "--max_steps",
        "1",
        "--output_dir",
        run,
        "--resume_from_checkpoint",
    )
    assert "run.json is not valid JSON" in line
    assert snapshot(run) == before


@pytest.mark.parametrize("flag", ["--metrics", "--card-facts"])
def test_push_names_a_bad_json_file(world, tmp_path, capsys, flag):
    bad = tmp_path / "facts.json"
    bad.write_text("{'not': json}")
    line = refused(capsys, "push", world["adapter"], "user/repo", flag, bad)
    assert str(bad) in line and "not valid JSON" in line


def test_push_names_a_directory_given_for_a_json_file(world, tmp_path, capsys):
    line = refused(capsys, "push", world["adapter"], "user/repo", "--metrics", tmp_path)
    assert f"{tmp_path} is a directory, where a file was expected" in line


# ----------------------------------------------------------------------------------------- add-items


@pytest.fixture(scope="module")
def lm_index(world, tmp_path_factory):
    """The toy catalogue's SID index built with a real encoder (the tiny base's mean hidden states)."""
    from peft_grounded.sids import build_sids

    folder = tmp_path_factory.mktemp("lm-index") / "sids"
    build_sids(
        world["catalogue"],
        folder,
        encoder=f"lm:{world['base']}",
        codes=4,
        levels=2,
        show_progress=False,
        use_cache=False,
    )
    return folder


def new_items_file(tmp_path, **overrides):
    items = {"n1": {"title": "A new pen"}, "n2": {"title": "A new lamp"}} | overrides
    return write_lcrec(tmp_path / "new", items, {})


def add_items(capsys, world, lm_index, catalogue, out, *extra):
    from helpers.robust_world import run_cli

    return run_cli(
        capsys,
        "add-items",
        "--sid-index",
        lm_index,
        "--catalogue",
        catalogue,
        "--encoder",
        f"lm:{world['base']}",
        "--no-cache",
        "--no-progress",
        "--output_dir",
        out,
        *extra,
    )


def test_add_items_refuses_a_repeated_id_with_another_text(world, lm_index, tmp_path, capsys):
    catalogue = tmp_path / "new.jsonl"
    rows = [
        {"item_id": "n1", "title": "A new pen"},
        {"item_id": "n2", "title": "Lamp"},
        {"item_id": "n1", "title": "A chair"},
    ]
    catalogue.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, _, err = add_items(capsys, world, lm_index, catalogue, tmp_path / "v2")
    assert code == 2 and "1 item ids appear more than once in" in err and "(e.g. ['n1'])" in err
    assert "1 of them with different records" in err and "--skip-problems" in err
    assert not (tmp_path / "v2").exists()
    code, out, _ = add_items(capsys, world, lm_index, catalogue, tmp_path / "v2", "--skip-problems")
    assert code == 0 and "left out: 1 duplicated in the batch" in out
    from peft_grounded.sids import SIDIndex

    child = SIDIndex.load(tmp_path / "v2")
    assert child.added_items() == ["n1", "n2"] and child.quality["growth"][-1]["duplicates"] == ["n1"]


def test_add_items_refuses_an_item_without_text(world, lm_index, tmp_path, capsys):
    catalogue = new_items_file(tmp_path, n3={"title": "", "description": ""})
    code, _, err = add_items(capsys, world, lm_index, catalogue, tmp_path / "v2")
    assert code == 2 and "have no text in any field (e.g. ['n3'])" in err and "--drop-empty-text" in err
    assert not (tmp_path / "v2").exists()
    code, out, _ = add_items(capsys, world, lm_index, catalogue, tmp_path / "v2", "--drop-empty-text")
    assert code == 0 and "left out: 1 with empty text" in out


# ----------------------------------------------------------------------------------------- embedding cache


def test_a_zeroed_embedding_cache_is_detected_and_encoded_again(world, tmp_path, capsys, caplog):
    from helpers.robust_world import run_cli

    from peft_grounded.sids import SIDIndex

    def build(out):
        code, _, _ = run_cli(
            capsys, *build_sids_args(world, world["catalogue"], out, "--cache-dir", tmp_path / "cache")
        )
        assert code == 0
        return SIDIndex.load(out)

    first = build(tmp_path / "a")
    shards = list((tmp_path / "cache").rglob("*.vecs.npy"))
    assert shards
    for shard in shards:  # zeroed in place, same size: only the checksum tells
        shard.write_bytes(bytes(shard.stat().st_size))
    with caplog.at_level("WARNING"):
        again = build(tmp_path / "b")
    assert "fails its SHA-256 check" in caplog.text
    assert again.fingerprint() == first.fingerprint()  # re-encoded: the same SIDs, not all items on one
    assert np.array_equal(again.codes, first.codes) and len(set(map(tuple, again.codes[:, :-1].tolist()))) > 1
    assert all(not s.exists() for s in shards)  # the damaged shards are gone, fresh ones written
    assert list((tmp_path / "cache").rglob("*.sum.json"))


def test_permissions_of_the_users_files_are_unchanged_by_a_refusal(world, tmp_path, capsys):
    """A refused command leaves modes and times as they were, not only contents."""
    before = {p: (p.stat().st_mode, p.stat().st_mtime_ns) for p in world["root"].rglob("*")}
    refused(capsys, "ground", *data_args(world), "--max_steps", "0", "--output_dir", tmp_path / "g")
    assert {p: (p.stat().st_mode, p.stat().st_mtime_ns) for p in world["root"].rglob("*")} == before
    assert os.listdir(tmp_path) == []
