"""The SID index: unique SIDs, centroids, the adapter hand-over, lookups, save/load and damaged files."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers.sids_fixtures import clustered_vectors

from peft_grounded.diagnostics.diagnose import level0_labels, majority_labels, token_frequencies
from peft_grounded.sids.build import index_from_vectors
from peft_grounded.sids.collisions import add_disambiguation_level, collision_stats, reassign_last_level
from peft_grounded.sids.index import (
    JSON_NAME,
    EncoderMismatchError,
    IndexFileError,
    SIDIndex,
    sid_vocabulary,
    tensors_path,
    token_descriptions,
)
from peft_grounded.sids.quantizers import RQKMeansConfig

ENCODER = {"kind": "sentence-transformers", "model": "toy", "weights": "abc", "dim": 32, "normalize": True}


def _vectors_with_duplicates():
    x, cluster, _ = clustered_vectors(n_clusters=4, sub=2, per_sub=10, seed=0)  # 80 items
    x[1] = x[0]  # identical texts -> identical vectors: a collision no quantiser can avoid
    x[2] = x[0]
    cluster[1] = cluster[2] = cluster[0]
    return x, cluster


@pytest.fixture(scope="module")
def index():
    x, cluster = _vectors_with_duplicates()
    ids = [f"item{i}" for i in range(len(x))]
    return index_from_vectors(
        x,
        ids,
        RQKMeansConfig(codes_per_level=(4, 4), seed=0),
        dedup="level",
        encoder=ENCODER,
        text_template={"fields": ["title"]},
        item_interactions=np.arange(len(x)),
        item_categories=[("Cat" + str(c), "Leaf") for c in cluster],
    )


def test_disambiguation_level_makes_sids_unique(index):
    before, after = index.quality["collisions_before"], index.quality["collisions_after"]
    assert before["collision_rate"] > 0 and before["max_items_per_sid"] >= 3
    assert after["collision_rate"] == 0 and after["unique_sids"] == index.n_items
    assert index.n_levels == 3 and index.disambiguation_level
    assert index.codes_per_level[2] == before["max_items_per_sid"]
    assert index.sid_of("item0")[:2] == index.sid_of("item1")[:2] == index.sid_of("item2")[:2]
    assert len({index.sid_of(f"item{i}") for i in range(3)}) == 3


def test_disambiguation_orders_by_fit_then_catalogue_order():
    codes = np.array([[0, 1], [0, 1], [2, 2], [0, 1]])
    out = add_disambiguation_level(codes, np.array([0.5, 0.1, 0.0, 0.1]))
    assert out[:, 2].tolist() == [2, 0, 0, 1]


def test_reassign_separates_collisions_at_the_last_level():
    x, _ = _vectors_with_duplicates()
    ids = [str(i) for i in range(len(x))]
    idx = index_from_vectors(x, ids, RQKMeansConfig(codes_per_level=(4, 32), seed=0), dedup="reassign")
    assert idx.n_levels == 2 and not idx.disambiguation_level
    assert idx.quality["collisions_before"]["collision_rate"] > 0
    assert idx.quality["collisions_after"]["collision_rate"] == 0
    assert idx.quality["unresolved_collisions"] == 0
    assert idx.quality["mse"] >= 0


def test_reassign_is_optimal_and_counts_what_it_cannot_fix():
    book = np.array([[0.0], [1.0], [10.0]])
    residual = np.array([[0.1], [0.2], [0.9]])
    codes = np.array([[5, 0], [5, 0], [5, 1]])
    new, unresolved = reassign_last_level(codes, residual, book)
    assert unresolved == 0
    assert new[:, 1].tolist() == [0, 1, 2] or new[:, 1].tolist() == [1, 0, 2]
    assert sorted(new[:, 1].tolist()) == [0, 1, 2]  # all distinct, cheapest total: 0.1->0, 0.2->?, 0.9->?
    # four items on one prefix, three codes: one collision is left, and counted
    codes4 = np.array([[5, 0]] * 4)
    new4, unresolved4 = reassign_last_level(codes4, np.array([[0.0], [0.1], [0.2], [0.3]]), book)
    assert unresolved4 == 1 and collision_stats(new4).n_unique == 3


def test_no_dedup_keeps_collisions(index):
    x, _ = _vectors_with_duplicates()
    idx = index_from_vectors(
        x, [str(i) for i in range(len(x))], RQKMeansConfig(codes_per_level=(4, 4)), dedup="none"
    )
    assert idx.quality["collisions_after"] == idx.quality["collisions_before"]
    with pytest.raises(ValueError, match="dedup must be one of"):
        index_from_vectors(x, [str(i) for i in range(len(x))], dedup="maybe")


def test_adapter_init_rows_follow_the_token_order(index):
    tokens, vectors = index.adapter_init()
    assert tokens == sid_vocabulary(index.codes_per_level) == index.token_strings
    assert tokens[:2] == ["<a_0>", "<a_1>"] and tokens[4] == "<b_0>"
    assert isinstance(vectors, torch.Tensor) and vectors.dtype == torch.float32
    assert vectors.shape == (index.n_tokens, index.dim) == (4 + 4 + index.codes_per_level[2], 32)
    with pytest.raises(ValueError, match="unknown centroid variant"):
        index.adapter_init("random")


def test_item_centroids_are_means_of_original_vectors(index):
    x, _ = _vectors_with_duplicates()
    _, items = index.adapter_init("items")
    for level in range(index.n_levels):
        for code in range(index.codes_per_level[level]):
            members = index.codes[:, level] == code
            row = index.token_offset(level) + code
            if members.any():
                assert torch.allclose(items[row], torch.as_tensor(x[members].mean(0)), atol=1e-4)
            else:
                assert torch.allclose(items[row], torch.as_tensor(x.mean(0)), atol=1e-4)


def test_codebook_centroids_are_the_codebooks(index):
    _, book = index.adapter_init("codebook")
    assert torch.allclose(book[:4], torch.as_tensor(index.codebooks[0]))
    assert torch.allclose(book[4:8], torch.as_tensor(index.codebooks[1]))
    # level 0 of both variants coincide (k-means centroids are item means) up to the last update
    _, items = index.adapter_init("items")
    assert torch.allclose(book[:4], items[:4], atol=0.5)


def test_lookups(index):
    sid = index.sid_of("item5")
    assert index.sid_text("item5") == "".join(f"<{'abc'[lv]}_{c}>" for lv, c in enumerate(sid))
    assert index.item_of(sid) == "item5" and index.item_of(index.sid_text("item5")) == "item5"
    assert index.item_of((99, 99, 99)) is None
    under = index.items_with_prefix(sid[:1])
    assert "item5" in under
    assert set(under) == {i for i in index.item_ids if index.sid_of(i)[0] == sid[0]}
    assert index.items_with_prefix(index.sid_text("item5")) == ["item5"]
    assert sorted(index.items_with_prefix([])) == sorted(index.item_ids)
    assert index.items_with_prefix("<a_3><b_99>") == []
    assert index.sid_texts()[5] == index.sid_text("item5") == index.sid_map()["item5"]
    assert index.to_lcrec_json()["item5"] == [f"<{'abc'[lv]}_{c}>" for lv, c in enumerate(sid)]
    assert "item5" in index and "nope" not in index
    with pytest.raises(KeyError, match="not in the SID index"):
        index.sid_of("nope")


def test_token_frequencies_and_labels(index):
    freq = token_frequencies(index)
    assert freq.shape == (index.n_tokens,)
    for level in range(index.n_levels):
        off = index.token_offset(level)
        assert freq[off : off + index.codes_per_level[level]].sum() == index.n_items
    by_inter = token_frequencies(index, "interactions")
    assert by_inter[:4].sum() == np.arange(index.n_items).sum()
    custom = token_frequencies(index, "interactions", counts={"item0": 7})
    assert custom[index.sid_of("item0")[0]] == 7 and custom[:4].sum() == 7
    labels = majority_labels(index, 0)
    assert all(share == 1.0 for _, share in labels)  # level 0 recovers the 4 clusters
    assert sorted(level0_labels(index)) == ["Cat0", "Cat1", "Cat2", "Cat3"]
    assert level0_labels(index, depth=1) == ["Leaf"] * 4


def test_quality_figures(index):
    q = index.quality
    assert [lv["codes"] for lv in q["levels"]] == list(index.codes_per_level)
    assert q["levels"][0]["used"] == 4 and q["levels"][0]["normalized_entropy"] > 0.9
    assert q["levels"][2]["disambiguation"] and not q["levels"][0]["disambiguation"]
    assert 0 < q["relative_error"] < q["relative_error_per_level"][0] < 1
    assert "collision rate" in index.summary()


def test_save_load_round_trip(index, tmp_path):
    index.save(tmp_path / "idx")
    loaded = SIDIndex.load(tmp_path / "idx")
    assert loaded.item_ids == index.item_ids
    assert np.array_equal(loaded.codes, index.codes)
    assert loaded.codes_per_level == index.codes_per_level
    for variant in ("items", "codebook"):
        assert np.array_equal(loaded.centroids[variant], index.centroids[variant])
    assert loaded.encoder == ENCODER and loaded.text_template == {"fields": ["title"]}
    assert loaded.quality == json.loads(json.dumps(index.quality))
    assert loaded.item_categories == index.item_categories
    assert np.array_equal(loaded.item_interactions, index.item_interactions)
    assert SIDIndex.load(tmp_path / "idx" / JSON_NAME).sid_text("item3") == index.sid_text("item3")
    assert not list((tmp_path / "idx").glob("*.tmp"))  # no temporary files left behind
    meta = json.loads((tmp_path / "idx" / JSON_NAME).read_text())
    assert meta["version"] == 1 and meta["tokens"] == index.token_strings


def test_truncated_tensor_file(index, tmp_path):
    path = tensors_path(index.save(tmp_path / "idx"))
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(IndexFileError, match=r"truncated.*rebuild it with `peft-grounded build-sids`"):
        SIDIndex.load(tmp_path / "idx")


def test_corrupted_tensor_file(index, tmp_path):
    path = tensors_path(index.save(tmp_path / "idx"))
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(IndexFileError, match="SHA-256"):
        SIDIndex.load(tmp_path / "idx")


def test_truncated_json_and_missing_files(index, tmp_path):
    directory = index.save(tmp_path / "idx")
    text = (directory / JSON_NAME).read_text()
    (directory / JSON_NAME).write_text(text[: len(text) // 2])
    with pytest.raises(IndexFileError, match="truncated or corrupted"):
        SIDIndex.load(directory)
    with pytest.raises(IndexFileError, match=r"missing sid_index\.json"):
        SIDIndex.load(tmp_path / "elsewhere")
    index.save(directory)
    tensors_path(directory).unlink()
    with pytest.raises(IndexFileError, match="missing"):
        SIDIndex.load(directory)


def test_newer_version_and_foreign_json(index, tmp_path):
    directory = index.save(tmp_path / "idx")
    meta = json.loads((directory / JSON_NAME).read_text())
    (directory / JSON_NAME).write_text(json.dumps(meta | {"version": 99}))
    with pytest.raises(IndexFileError, match=r"newer.*upgrade"):
        SIDIndex.load(directory)
    (directory / JSON_NAME).write_text(json.dumps({k: v for k, v in meta.items() if k != "tensors"}))
    with pytest.raises(IndexFileError, match="lacks its tensor-file record"):
        SIDIndex.load(directory)
    (directory / JSON_NAME).write_text(json.dumps({"hello": 1}))
    with pytest.raises(IndexFileError, match="not a peft_grounded SID index"):
        SIDIndex.load(directory)


def test_vectors_from_another_encoder_are_refused(index):
    x, _ = _vectors_with_duplicates()
    assert np.array_equal(index.quantize(x[:5], encoder=ENCODER), index.codes[:5, :2])
    other = ENCODER | {"weights": "def"}
    with pytest.raises(EncoderMismatchError, match=r"built with encoder 'toy'.*weights.*rebuild"):
        index.quantize(x[:5], encoder=other)
    with pytest.raises(EncoderMismatchError, match="do not match the index's 32-d encoder"):
        index.quantize(np.zeros((2, 16), np.float32))


def test_token_descriptions_list_the_most_popular_titles(index):
    titles = {i: f"Title {i}" for i in index.item_ids}
    texts = token_descriptions(index, titles, per_token=2)
    assert len(texts) == index.n_tokens
    code = index.sid_of("item79")[0]
    members = [i for i in index.item_ids if index.sid_of(i)[0] == code]
    # item_interactions are arange(n): the most popular members are the highest-numbered
    top = sorted(members, key=lambda i: -int(i[4:]))[:2]
    assert texts[code] == "; ".join(f"Title {i}" for i in top)


def test_the_same_index_saves_to_the_same_bytes(index, tmp_path):
    """The tensor file is named by its hash: a rebuild of the same index writes the same file (safetensors
    orders a header's metadata keys differently from one save to the next, so the header holds one)."""
    names = {tensors_path(index.save(tmp_path / f"idx{i}")).name for i in range(8)}
    assert len(names) == 1
    assert len({(tmp_path / f"idx{i}" / JSON_NAME).read_text() for i in range(8)}) == 1


def test_a_new_save_never_overwrites_the_tensor_file_in_use(index, tmp_path):
    """Saving again writes a new content-named tensor file before switching the JSON to it."""
    directory = index.save(tmp_path / "idx")
    first = tensors_path(directory)
    changed = SIDIndex.load(directory)
    changed.quality = {**changed.quality, "note": "changed"}
    changed.codes = changed.codes.copy()
    changed.codes[0, -1] = (changed.codes[0, -1] + 1) % changed.codes_per_level[-1]
    changed.save(directory)
    second = tensors_path(directory)
    assert second != first and second.is_file() and not first.exists()
    assert SIDIndex.load(directory).codes[0, -1] == changed.codes[0, -1]
