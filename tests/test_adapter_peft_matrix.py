"""What PEFT's common test matrix (``PeftCommonTester``, benchmarks/peft_common_matrix.py) caught, as our own tests.

PEFT runs its matrix with ``init_weights=False``, which for TrainableTokens draws random rows (``torch.randn``) so
that the adapter changes the output; here it had kept the base's rows, so every test that needs the adapter to
change the output failed (merge, safe merge, unload, save/load). ``init_weights`` now means what it means in PEFT,
both values: True (the default) the no-op start (``init="keep"``, unless ``init`` names another), False random
rows. The matrix also caught a tuner layer without ``in_features``/``out_features``,
and a model without ``get_input_embeddings`` (a plain ``nn.Module``, which TrainableTokens wraps by
``target_modules``) refused.

Tiny Llama (tied, untied) and Qwen3 (new rows in the embedding's padding) models, and one plain module.
"""

from __future__ import annotations

import copy

import pytest
import torch
from peft import PeftModel, TrainableTokensConfig, get_peft_model
from peft.tuners.tuners_utils import BaseTunerLayer
from torch import nn

from peft_grounded import GroundedTokenConfig
from peft_grounded.adapter import GroundedHead, GroundedTokenLayer

VOCAB = 1000
NEW = list(range(VOCAB, VOCAB + 12))
INPUT = torch.tensor([[5, NEW[0], 7, NEW[3], NEW[11], 3, NEW[3]]])
CASES = [("llama", True), ("llama", False), ("qwen3", False)]
IDS = ["llama-tied", "llama-untied", "qwen3-untied"]


def base(factory, arch: str, tied: bool) -> nn.Module:
    """A tiny LM with 12 new rows: appended (Llama) or in the embedding's padding (Qwen3, as its checkpoints)."""
    if arch == "qwen3":
        return factory(arch, tied, vocab_size=VOCAB, extra_rows=64)
    model = factory(arch, tied, vocab_size=VOCAB)
    model.resize_token_embeddings(VOCAB + len(NEW), mean_resizing=False)
    return model


def random_config(**kwargs) -> GroundedTokenConfig:
    return GroundedTokenConfig(token_indices=NEW, original_vocab_size=VOCAB, init_weights=False, **kwargs)


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=INPUT).logits


def base_matrices(model) -> list[torch.Tensor]:
    """The base's embedding (and untied head) matrices, cloned."""
    embedding = model.get_input_embeddings()
    head = model.get_output_embeddings()
    matrices = [getattr(embedding, "base_layer", embedding).weight]
    head_weight = getattr(head, "base_layer", head).weight
    if head_weight is not matrices[0]:
        matrices.append(head_weight)
    return [m.detach().clone() for m in matrices]


@pytest.mark.parametrize(("arch", "tied"), CASES, ids=IDS)
@pytest.mark.parametrize("init", [None, "mean", "keep", "gaussian"])
def test_init_weights_false_draws_the_rows_trainable_tokens_draws(tiny_model_factory, arch, tied, init):
    model = base(tiny_model_factory, arch, tied)
    expected = logits(model)
    torch.manual_seed(0)
    grounded = get_peft_model(copy.deepcopy(model), random_config(init=init))
    torch.manual_seed(0)
    peft_tt = TrainableTokensConfig(target_modules=["embed_tokens"], token_indices=NEW, init_weights=False)
    theirs = get_peft_model(copy.deepcopy(model), peft_tt)

    layer = grounded.get_input_embeddings()
    rows = layer.grounded_embedding["default"]
    # whatever `init` says: torch.randn from the global generator, the very rows TrainableTokens draws
    assert torch.equal(rows, theirs.get_input_embeddings().trainable_tokens_delta["default"])
    assert 0.8 < rows.std().item() < 1.2
    if not tied:  # the untied head's rows are random too, drawn after the input rows
        head_rows = layer.grounded_head["default"]
        assert head_rows.shape == rows.shape and not torch.equal(head_rows, rows)
        assert not torch.equal(head_rows, model.get_output_embeddings().weight[NEW])
    assert not torch.allclose(logits(grounded), expected, atol=1e-3)

    torch.manual_seed(0)
    again = get_peft_model(copy.deepcopy(model), random_config(init=init))
    assert torch.equal(again.get_input_embeddings().grounded_embedding["default"], rows)  # seeded like PEFT


@pytest.mark.parametrize(("arch", "tied"), CASES, ids=IDS)
@pytest.mark.parametrize("init", [None, "keep"], ids=["init-not-given", "init-keep"])
def test_init_weights_true_is_the_no_op_start(tiny_model_factory, arch, tied, init):
    """PEFT's ``init_weights=True`` (the default): the adapter starts as a no-op, the rows the embedding holds
    (as ``TrainableTokensConfig(init_weights=True)`` keeps them), so the outputs are the base's."""
    model = base(tiny_model_factory, arch, tied)
    config = GroundedTokenConfig(token_indices=NEW, original_vocab_size=VOCAB, init=init, init_weights=True)
    assert config.init == "keep" and config.to_dict()["init"] == "keep"  # a saved config names the start
    kept = get_peft_model(copy.deepcopy(model), config)
    layer = kept.get_input_embeddings()
    assert torch.equal(layer.grounded_embedding["default"], model.get_input_embeddings().weight[NEW])
    if not tied:
        assert torch.equal(layer.grounded_head["default"], model.get_output_embeddings().weight[NEW])
    torch.testing.assert_close(logits(kept), logits(model), rtol=1e-5, atol=1e-8)
    theirs = get_peft_model(
        copy.deepcopy(model), TrainableTokensConfig(target_modules=["embed_tokens"], token_indices=NEW)
    )
    assert torch.equal(  # the very rows TrainableTokens starts from with its default init_weights=True
        layer.grounded_embedding["default"], theirs.get_input_embeddings().trainable_tokens_delta["default"]
    )


@pytest.mark.parametrize(("arch", "tied"), CASES, ids=IDS)
def test_init_weights_true_starts_by_an_init_given(tiny_model_factory, arch, tied):
    model = base(tiny_model_factory, arch, tied)
    started = get_peft_model(
        copy.deepcopy(model), GroundedTokenConfig(token_indices=NEW, original_vocab_size=VOCAB, init="mean")
    )
    mean = model.get_input_embeddings().weight[:VOCAB].double().mean(dim=0).float()
    rows = started.get_input_embeddings().grounded_embedding["default"]
    torch.testing.assert_close(rows, mean.expand_as(rows).contiguous(), rtol=0, atol=1e-6)


@pytest.mark.parametrize(("arch", "tied"), CASES, ids=IDS)
@pytest.mark.parametrize("safe_merge", [False, True])
def test_merge_unmerge_and_unload_with_random_rows(tiny_model_factory, arch, tied, safe_merge):
    model = base(tiny_model_factory, arch, tied)
    expected_base = logits(model)
    originals = base_matrices(model)
    torch.manual_seed(0)
    peft_model = get_peft_model(model, random_config())
    adapted = logits(peft_model)
    assert not torch.allclose(adapted, expected_base, atol=1e-3)

    peft_model.merge_adapter(safe_merge=safe_merge)
    torch.testing.assert_close(logits(peft_model), adapted, rtol=1e-4, atol=1e-4)
    peft_model.merge_adapter(safe_merge=safe_merge)  # idempotent
    torch.testing.assert_close(logits(peft_model), adapted, rtol=1e-4, atol=1e-4)
    peft_model.unmerge_adapter()
    torch.testing.assert_close(logits(peft_model), adapted, rtol=1e-4, atol=1e-4)
    assert all(torch.equal(a, b) for a, b in zip(base_matrices(peft_model), originals, strict=True))
    with peft_model.disable_adapter():
        torch.testing.assert_close(logits(peft_model), expected_base, rtol=1e-5, atol=1e-6)

    rows = peft_model.get_input_embeddings().grounded_embedding["default"].detach().clone()
    unloaded = peft_model.merge_and_unload(safe_merge=safe_merge)
    assert not any(isinstance(m, (BaseTunerLayer, GroundedHead)) for m in unloaded.modules())
    assert not hasattr(unloaded, "peft_config")
    assert torch.equal(unloaded.get_input_embeddings().weight[NEW], rows)
    torch.testing.assert_close(logits(unloaded), adapted, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(logits(unloaded), expected_base, atol=1e-3)


@pytest.mark.parametrize(("arch", "tied"), CASES, ids=IDS)
def test_save_load_roundtrip_with_random_rows(tiny_model_factory, arch, tied, tmp_path):
    expected_base = logits(base(tiny_model_factory, arch, tied))
    torch.manual_seed(0)
    model = get_peft_model(base(tiny_model_factory, arch, tied), random_config())
    before = logits(model)
    assert not torch.allclose(before, expected_base, atol=1e-3)  # PEFT's sanity check: the adapter shows
    model.save_pretrained(tmp_path)

    torch.manual_seed(54321)  # another seed: the rows must come from the checkpoint, not from a new draw
    loaded = PeftModel.from_pretrained(base(tiny_model_factory, arch, tied), tmp_path)
    torch.testing.assert_close(logits(loaded), before, rtol=1e-5, atol=1e-5)
    layer = loaded.get_input_embeddings()
    assert torch.equal(
        layer.grounded_embedding["default"], model.get_input_embeddings().grounded_embedding["default"]
    )


@pytest.mark.parametrize(("arch", "tied"), CASES, ids=IDS)
def test_tuner_layer_exposes_in_and_out_features(tiny_model_factory, arch, tied):
    model = get_peft_model(base(tiny_model_factory, arch, tied), random_config())
    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    assert layers and all(isinstance(m, GroundedTokenLayer) for m in layers)
    rows = VOCAB + (64 if arch == "qwen3" else len(NEW))
    assert [(m.in_features, m.out_features) for m in layers] == [(rows, 64)]  # as PEFT's nn.Embedding layers


class PlainEmbeddingModel(nn.Module):
    """A model with an embedding and no ``get_input_embeddings``, as PEFT's custom-model tests have."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(50, 8)
        self.lin = nn.Linear(8, 3)

    def forward(self, x):
        return self.lin(self.emb(x)).log_softmax(dim=-1)


def test_a_model_without_get_input_embeddings_is_wrapped_by_target_modules(tmp_path):
    x = torch.arange(50).view(5, 10)
    plain = PlainEmbeddingModel()
    expected = plain(x).detach()
    config = GroundedTokenConfig(
        target_modules=["emb"],
        token_indices=[2, 40, 41],
        tokens_are_new=False,
        init_weights=False,
        task_type=None,
    )
    torch.manual_seed(0)
    model = get_peft_model(plain, config)
    layer = model.base_model.model.emb
    assert isinstance(layer, GroundedTokenLayer) and layer.head is None
    assert [n for n, p in model.named_parameters() if p.requires_grad] == [
        "base_model.model.emb.grounded_embedding.default"
    ]
    adapted = model(x).detach()
    assert not torch.allclose(adapted, expected, atol=1e-3)
    assert torch.equal(adapted[1:4], expected[1:4])  # rows of the input without the adapter's tokens
    with model.disable_adapter():
        assert torch.equal(model(x), expected)

    model.save_pretrained(tmp_path)
    torch.manual_seed(1)
    loaded = PeftModel.from_pretrained(PlainEmbeddingModel(), tmp_path)
    assert torch.equal(loaded(x), adapted)

    unloaded = model.merge_and_unload(safe_merge=True)
    assert isinstance(unloaded.emb, nn.Embedding)
    torch.testing.assert_close(unloaded(x), adapted, rtol=1e-6, atol=1e-6)
