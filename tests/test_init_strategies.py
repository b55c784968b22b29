"""Every initialisation does what it promises, deterministically, through get_peft_model."""

from __future__ import annotations

import pytest
import torch
from peft import get_peft_model
from safetensors.torch import save_file

import peft_grounded
from peft_grounded import GroundedTokenConfig
from peft_grounded.adapter.starts import project_vectors


def wrap(
    tokenizer, factory, init, tied=True, codes=(8, 8), arch="llama", mix=None, prepare=None, data=None, **kw
):
    """The rows ``init`` starts (``data``: what ``initialize_grounded_rows`` then gives, after creation)."""
    from transformers import AutoTokenizer

    base = factory(arch, tied, extra_rows=64 if arch == "qwen3" else 0)
    if mix is not None:  # give the vocabulary an anisotropic, correlated distribution
        with torch.no_grad():
            base.get_input_embeddings().weight.copy_(base.get_input_embeddings().weight @ mix)
    if prepare is not None:
        prepare(base)
    new = peft_grounded.add_sid_tokens(
        AutoTokenizer.from_pretrained(tokenizer.name_or_path), base, list(codes)
    )
    vocab_in = base.get_input_embeddings().weight[: new.original_vocab_size].detach().clone()
    vocab_out = base.get_output_embeddings().weight[: new.original_vocab_size].detach().clone()
    model = get_peft_model(base, GroundedTokenConfig(token_indices=new, init=init, **kw))
    if data is not None:
        peft_grounded.initialize_grounded_rows(model, **data)
    layer = model.get_input_embeddings()
    rows_out = layer.grounded_head["default"].detach() if not tied else None
    return layer.grounded_embedding["default"].detach(), rows_out, vocab_in, vocab_out, new


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_mean_is_the_exact_mean_of_existing_rows(tokenizer, tiny_model_factory, arch):
    rows, rows_out, vocab_in, vocab_out, _ = wrap(
        tokenizer, tiny_model_factory, "mean", tied=False, arch=arch
    )
    assert torch.equal(rows, vocab_in.double().mean(0).float().expand_as(rows))
    assert torch.equal(rows_out, vocab_out.double().mean(0).float().expand_as(rows_out))


def test_gaussian_matches_vocabulary_moments_and_is_seeded(tokenizer, tiny_model_factory):
    generator = torch.Generator().manual_seed(0)
    mix = torch.randn(64, 64, generator=generator) @ torch.diag(torch.logspace(1, -1, 64))
    rows, _, vocab, _, _ = wrap(
        tokenizer, tiny_model_factory, "gaussian", codes=(1024, 1024), init_seed=3, mix=mix
    )
    again, *_ = wrap(tokenizer, tiny_model_factory, "gaussian", codes=(1024, 1024), init_seed=3, mix=mix)
    other, *_ = wrap(tokenizer, tiny_model_factory, "gaussian", codes=(1024, 1024), init_seed=4, mix=mix)
    assert torch.equal(rows, again) and not torch.equal(rows, other)
    vocab, sample = vocab.double(), rows.double()
    eigenvalues, eigenvectors = torch.linalg.eigh(torch.cov(vocab.T))
    for k in (-1, -2, 0):  # largest, second largest and smallest direction of the vocabulary
        direction = eigenvectors[:, k]
        assert abs((sample @ direction).var() / eigenvalues[k] - 1) < 0.1
        assert abs((sample @ direction).mean() - (vocab @ direction).mean()) < 0.1 * eigenvalues[k].sqrt()
    assert eigenvalues[-1] / eigenvalues[0] > 1e3  # the check above is meaningful: strongly anisotropic


def test_random_is_the_models_initialiser(tokenizer, tiny_model_factory):
    rows, *_ = wrap(tokenizer, tiny_model_factory, "random", codes=(1024,), init_seed=1)
    again, *_ = wrap(tokenizer, tiny_model_factory, "random", codes=(1024,), init_seed=1)
    assert torch.equal(rows, again)
    assert abs(rows.std().item() - 0.02) < 0.001 and abs(rows.mean().item()) < 0.001


def test_description_is_the_mean_of_the_texts_token_rows(tokenizer, tiny_model_factory, smollm2_dir):
    texts = ["Toy Story; GoldenEye", "Four Rooms", "Get Shorty and more"]
    rows, rows_out, *_ = wrap(
        tokenizer,
        tiny_model_factory,
        "description",
        tied=False,
        codes=(3,),
        data={"texts": texts, "tokenizer": tokenizer},
    )
    base = tiny_model_factory("llama", False)
    for i, text in enumerate(texts):
        ids = torch.as_tensor(tokenizer(text, add_special_tokens=False)["input_ids"])
        expected_in = base.get_input_embeddings().weight[ids].double().mean(0).float()
        expected_out = base.get_output_embeddings().weight[ids].double().mean(0).float()
        torch.testing.assert_close(rows[i], expected_in, rtol=0, atol=1e-6)
        torch.testing.assert_close(rows_out[i], expected_out, rtol=0, atol=1e-6)
    ids_rows, *_ = wrap(
        tokenizer,
        tiny_model_factory,
        "description",
        tied=False,
        codes=(3,),
        init_texts=[tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts],
    )
    assert torch.equal(ids_rows, rows)


def test_centroid_truncates_wide_vectors_and_mean_shifts(tokenizer, tiny_model_factory):
    vectors = torch.randn(16, 100, generator=torch.Generator().manual_seed(0))
    rows, _, vocab, _, _ = wrap(
        tokenizer, tiny_model_factory, "centroid", init_vectors=vectors, norm_match=False
    )
    mean = vocab.double().mean(0)
    torch.testing.assert_close(rows.double().mean(0), mean, rtol=0, atol=1e-5)
    cut = vectors[:, :64].double()
    torch.testing.assert_close(rows.double() - mean, cut - cut.mean(0), rtol=0, atol=1e-5)


def test_centroid_norm_match_keeps_geometry(tokenizer, tiny_model_factory):
    vectors = torch.randn(16, 100, generator=torch.Generator().manual_seed(0))
    rows, _, vocab, _, _ = wrap(tokenizer, tiny_model_factory, "centroid", init_vectors=vectors)
    vocab = vocab.double()
    vocab_rms = (vocab - vocab.mean(0)).norm(dim=1).pow(2).mean().sqrt()
    deviations = rows.double() - rows.double().mean(0)
    torch.testing.assert_close(deviations.norm(dim=1).pow(2).mean().sqrt(), vocab_rms, rtol=1e-5, atol=0)
    cut = vectors[:, :64].double()
    cut = cut - cut.mean(0)
    ratio = torch.cdist(deviations, deviations) / torch.cdist(cut, cut).clamp(min=1e-12)
    off = ~torch.eye(16, dtype=torch.bool)
    assert ratio[off].std() / ratio[off].mean() < 1e-5  # one global scale


def test_centroid_pca_for_narrow_vectors_is_an_isometry_up_to_scale(tokenizer, tiny_model_factory):
    vectors = torch.randn(16, 10, generator=torch.Generator().manual_seed(1)) * torch.linspace(3, 0.3, 10)
    rows, _, vocab, _, _ = wrap(
        tokenizer, tiny_model_factory, "centroid", init_vectors=vectors, norm_match=False
    )
    centred = vectors.double() - vectors.double().mean(0)
    deviations = rows.double() - rows.double().mean(0)
    torch.testing.assert_close(
        torch.cdist(deviations, deviations), torch.cdist(centred, centred), rtol=1e-4, atol=1e-4
    )
    # the main axis of the centroids lies along the main axis of the vocabulary
    vocab_axis = torch.linalg.svd(vocab.double() - vocab.double().mean(0), full_matrices=False)[2][0]
    row_axis = torch.linalg.svd(deviations, full_matrices=False)[2][0]
    assert abs(torch.dot(vocab_axis, row_axis)) > 0.99


def test_centroid_lstsq_recovers_a_linear_encoder(tokenizer, tiny_model_factory, tmp_path):
    generator = torch.Generator().manual_seed(2)
    a = torch.randn(12, 64, generator=generator)
    b = torch.randn(64, generator=generator)
    anchor_ids = torch.arange(0, 5000, 7)
    anchor_vectors = torch.randn(len(anchor_ids), 12, generator=generator)

    def plant(base):  # the LM rows of the anchor tokens are a linear image of their "encoder" vectors
        with torch.no_grad():
            base.get_input_embeddings().weight[anchor_ids] = anchor_vectors @ a + b

    path = tmp_path / "anchors.safetensors"
    save_file({"token_ids": anchor_ids, "vectors": anchor_vectors}, str(path))
    vectors = torch.randn(16, 12, generator=generator)
    rows, *_ = wrap(
        tokenizer,
        tiny_model_factory,
        "centroid",
        init_vectors=vectors,
        init_anchors=str(path),
        norm_match=False,
        centroid_projection="lstsq",
        prepare=plant,
    )
    expected = (vectors @ a).double()
    deviations = rows.double() - rows.double().mean(0)
    expected = expected - expected.mean(0)
    assert (deviations - expected).norm() / expected.norm() < 0.01  # exact up to the ridge's shrinkage


def test_tensor_is_used_as_is(tokenizer, tiny_model_factory, tmp_path):
    matrix = torch.randn(16, 64)
    rows, *_ = wrap(tokenizer, tiny_model_factory, "tensor", init_vectors=matrix)
    assert torch.equal(rows, matrix)
    save_file({"vectors": matrix}, str(tmp_path / "m.safetensors"))
    from_file, *_ = wrap(
        tokenizer, tiny_model_factory, "tensor", init_vectors=str(tmp_path / "m.safetensors")
    )
    assert torch.equal(from_file, matrix)


def test_warm_start_from_a_saved_adapter_matches_by_string(tokenizer, tiny_model_factory, tmp_path):
    from transformers import AutoTokenizer

    base = tiny_model_factory("llama", False)
    new = peft_grounded.add_sid_tokens(tokenizer, base, [4, 4])
    saved = get_peft_model(base, GroundedTokenConfig(token_indices=new, init="random", init_seed=5))
    saved.save_pretrained(tmp_path / "saved")
    layer = saved.get_input_embeddings()
    # a second model whose tokens were added in another order
    other = tiny_model_factory("llama", False)
    order = list(reversed(new.tokens))
    added = peft_grounded.add_tokens(AutoTokenizer.from_pretrained(tokenizer.name_or_path), other, order)
    warm = get_peft_model(
        other, GroundedTokenConfig(token_indices=added, init="adapter", init_vectors=str(tmp_path / "saved"))
    )
    warm_layer = warm.get_input_embeddings()
    position = {t: i for i, t in enumerate(new.tokens)}
    perm = torch.as_tensor([position[t] for t in order])
    assert torch.equal(warm_layer.grounded_embedding["default"], layer.grounded_embedding["default"][perm])
    assert torch.equal(warm_layer.grounded_head["default"], layer.grounded_head["default"][perm])


def test_warm_start_from_another_models_adapter_is_a_clear_error(tokenizer, tiny_model_factory, tmp_path):
    import json

    from safetensors.torch import save_file

    base = tiny_model_factory("llama", True)
    new = peft_grounded.add_sid_tokens(tokenizer, base, [4, 4])
    folder = tmp_path / "other"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"token_strings": new.tokens}))
    key = "base_model.model.model.embed_tokens.grounded_embedding"
    save_file({key: torch.randn(len(new), 32)}, str(folder / "adapter_model.safetensors"))  # model is 64-d
    config = GroundedTokenConfig(token_indices=new, init="adapter", init_vectors=str(folder))
    with pytest.raises(ValueError, match="32-d but this model's rows are 64-d"):
        get_peft_model(base, config)
    save_file({key: torch.full((len(new), 64), float("nan"))}, str(folder / "adapter_model.safetensors"))
    with pytest.raises(ValueError, match="NaN or Inf"):
        get_peft_model(base, GroundedTokenConfig(token_indices=new, init="adapter", init_vectors=str(folder)))


def test_projection_rejects_truncating_narrow_vectors():
    with pytest.raises(ValueError, match="narrower"):
        project_vectors(torch.randn(4, 8), torch.randn(50, 16), "truncate")
    with pytest.raises(ValueError, match="init_anchors"):
        project_vectors(torch.randn(4, 8), torch.randn(50, 16), "lstsq")


def test_rows_of_a_half_precision_base_keep_full_precision(tokenizer, tiny_model_factory):
    """On a bf16 base the rows are float32 master weights: a given matrix is kept exactly."""
    from transformers import AutoTokenizer

    base = tiny_model_factory("llama", False, dtype=torch.bfloat16)
    new = peft_grounded.add_sid_tokens(AutoTokenizer.from_pretrained(tokenizer.name_or_path), base, [8])
    matrix = torch.randn(8, 64)
    model = get_peft_model(base, GroundedTokenConfig(token_indices=new, init="tensor", init_vectors=matrix))
    layer = model.get_input_embeddings()
    assert layer.grounded_embedding["default"].dtype == torch.float32
    assert torch.equal(layer.grounded_embedding["default"], matrix)
    assert torch.equal(layer.grounded_head["default"], matrix)


def test_description_of_an_unused_code_falls_back_to_the_mean(tokenizer, tiny_model_factory):
    with pytest.warns(UserWarning, match="empty description"):
        rows, _, vocab, _, _ = wrap(
            tokenizer, tiny_model_factory, "description", codes=(2,), init_texts=[[10, 11], []]
        )
    assert torch.equal(rows[1], vocab.double().mean(0).float())


def test_vocabulary_statistics_are_exact_in_chunks():
    from peft_grounded.adapter.starts import vocabulary_stats

    rows = torch.randn(1000, 12, dtype=torch.float64) * torch.linspace(0.1, 5, 12) + 3.0
    keep = torch.arange(0, 1000, 3)
    stats = vocabulary_stats(rows.float(), keep, chunk=64)
    expected = rows.float()[keep].double()
    torch.testing.assert_close(stats.mean, expected.mean(0), rtol=0, atol=1e-12)
    torch.testing.assert_close(stats.cov, torch.cov(expected.T), rtol=1e-10, atol=1e-12)
    rms = (expected - expected.mean(0)).norm(dim=1).pow(2).mean().sqrt()
    torch.testing.assert_close(stats.rms_deviation, rms, rtol=1e-10, atol=0)


@pytest.mark.slow
def test_lstsq_with_anchors_from_the_real_encoder(tokenizer, tiny_model_factory):
    """MiniLM's vectors of SmolLM2's word tokens anchor the lstsq map: centroids land in the LM's space."""
    from peft_grounded.adapter.starts import vocabulary_anchors, word_tokens
    from peft_grounded.sids import load_encoder

    ids = word_tokens(tokenizer, n=300)
    assert len(ids) == 300 and all(tokenizer.decode([i]).strip().isalpha() for i in ids)
    encoder = load_encoder("minilm")
    anchors = vocabulary_anchors(tokenizer, encoder, n=300)
    assert anchors["vectors"].shape == (300, encoder.dim)
    centroids = torch.as_tensor(encoder.encode(["comedy film", "horror film", "office chair", "stapler"]))
    rows, *_ = wrap(
        tokenizer,
        tiny_model_factory,
        "centroid",
        codes=(4,),
        init_vectors=centroids,
        init_anchors=anchors,
        centroid_projection="lstsq",
    )
    assert rows.shape == (4, 64) and torch.isfinite(rows).all()
    films = torch.nn.functional.cosine_similarity(rows[0] - rows.mean(0), rows[1] - rows.mean(0), dim=0)
    mixed = torch.nn.functional.cosine_similarity(rows[0] - rows.mean(0), rows[3] - rows.mean(0), dim=0)
    assert films > mixed  # the encoder's geometry survives the map


@pytest.mark.parametrize(
    ("bad_id", "message"),
    [(-1, r"outside the vocabulary \[0, 50\)"), (50, "outside the vocabulary"), (45, "of the new tokens")],
)
def test_anchor_ids_outside_the_vocabulary_or_new_are_errors(bad_id, message):
    """A negative id would wrap to the last rows (the new tokens'), silently; a new token is no anchor."""
    from peft_grounded.adapter.starts import InitData, initial_rows

    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(50, 16, generator=generator)  # rows 40..49 are the new tokens
    ids = [*range(0, 30), bad_id]
    data = InitData(
        vectors=torch.randn(10, 8, generator=generator),
        anchor_token_ids=ids,
        anchor_vectors=torch.randn(len(ids), 8, generator=generator),
        projection="lstsq",
    )
    with pytest.raises(ValueError, match=message):
        initial_rows("centroid", weight, list(range(40, 50)), slice(0, 40), data)
    data.anchor_token_ids = ids[:-1]
    data.anchor_vectors = data.anchor_vectors[:-1]
    assert initial_rows("centroid", weight, list(range(40, 50)), slice(0, 40), data).shape == (10, 16)


def test_a_tensor_file_without_the_key_lists_at_most_ten_names(tmp_path):
    """E.g. a whole model's safetensors passed as init_vectors: the error stays one readable line."""
    from peft_grounded.adapter.initialize import load_tensor

    path = tmp_path / "model.safetensors"
    save_file({f"layer.{i}.weight": torch.zeros(1) for i in range(300)}, str(path))
    with pytest.raises(KeyError, match=r"no tensor named 'vectors' .*and 290 more") as err:
        load_tensor(str(path), what="init_vectors", key="vectors")
    assert len(str(err.value)) < 500


@pytest.mark.parametrize(
    ("init", "tied", "arch"),
    [
        ("centroid", True, "llama"),
        ("centroid", False, "qwen3"),
        ("gaussian", False, "llama"),
        ("random", True, "qwen3"),
    ],
)
def test_init_scale_pulls_every_row_toward_the_vocabulary_mean(
    tokenizer, tiny_model_factory, init, tied, arch
):
    data = {"init_vectors": torch.randn(16, 100, generator=torch.Generator().manual_seed(0))}
    kw = data if init == "centroid" else {"init_seed": 3}
    full, full_out, vocab_in, vocab_out, _ = wrap(
        tokenizer, tiny_model_factory, init, tied=tied, arch=arch, **kw
    )
    pulled, pulled_out, *_ = wrap(
        tokenizer, tiny_model_factory, init, tied=tied, arch=arch, init_scale=0.1, **kw
    )
    for rows, start, vocab in ((pulled, full, vocab_in), (pulled_out, full_out, vocab_out)):
        if rows is None:
            continue
        mean = vocab.double().mean(0)
        torch.testing.assert_close(rows.double() - mean, 0.1 * (start.double() - mean), rtol=1e-5, atol=1e-6)
        # the directions of the deviations (a centroid start's geometry) are kept
        cosines = torch.nn.functional.cosine_similarity(rows.double() - mean, start.double() - mean, dim=1)
        assert cosines.min() > 1 - 1e-6


def test_init_scale_leaves_mean_and_copied_adapter_rows_alone(tokenizer, tiny_model_factory, tmp_path):
    rows, *_ = wrap(tokenizer, tiny_model_factory, "mean", init_scale=0.25)
    plain, *_ = wrap(tokenizer, tiny_model_factory, "mean")
    torch.testing.assert_close(rows, plain, rtol=0, atol=1e-6)
    base = tiny_model_factory("llama", False)
    new = peft_grounded.add_sid_tokens(tokenizer, base, [4, 4])
    saved = get_peft_model(base, GroundedTokenConfig(token_indices=new, init="random", init_seed=5))
    saved.save_pretrained(tmp_path / "saved")
    other = tiny_model_factory("llama", False)
    from transformers import AutoTokenizer

    added = peft_grounded.add_sid_tokens(AutoTokenizer.from_pretrained(tokenizer.name_or_path), other, [4, 4])
    config = GroundedTokenConfig(
        token_indices=added, init="adapter", init_vectors=str(tmp_path / "saved"), init_scale=0.25
    )
    warm = get_peft_model(other, config)
    for name in ("grounded_embedding", "grounded_head"):  # trained rows are copied as they are
        assert torch.equal(
            getattr(warm.get_input_embeddings(), name)["default"],
            getattr(saved.get_input_embeddings(), name)["default"],
        )


@pytest.mark.parametrize("bad", [0, -0.5, float("nan"), float("inf"), "0.1", True])
def test_init_scale_is_refused_outside_positive_finite_numbers(bad):
    with pytest.raises(ValueError, match="init_scale"):
        GroundedTokenConfig(token_indices=[70, 71], init_scale=bad)


def test_init_scale_is_saved_and_loaded(tokenizer, tiny_model_factory, tmp_path):
    from peft import PeftModel

    vectors = torch.randn(16, 100, generator=torch.Generator().manual_seed(0))
    base = tiny_model_factory("llama", True)
    from transformers import AutoTokenizer

    new = peft_grounded.add_sid_tokens(AutoTokenizer.from_pretrained(tokenizer.name_or_path), base, [8, 8])
    model = get_peft_model(
        base, GroundedTokenConfig(token_indices=new, init="centroid", init_vectors=vectors, init_scale=0.1)
    )
    rows = model.get_input_embeddings().grounded_embedding["default"].detach().clone()
    model.save_pretrained(tmp_path / "a")
    fresh = tiny_model_factory("llama", True)
    peft_grounded.add_sid_tokens(AutoTokenizer.from_pretrained(tokenizer.name_or_path), fresh, [8, 8])
    loaded = PeftModel.from_pretrained(fresh, tmp_path / "a")
    config = loaded.peft_config["default"]
    assert config.init_scale == 0.1
    # the saved rows come back as they were (the scale is not applied a second time on load)
    assert torch.equal(loaded.get_input_embeddings().grounded_embedding["default"].detach(), rows)
