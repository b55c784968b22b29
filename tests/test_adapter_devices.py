"""Models split over devices: the head's new columns are computed where the head's weight lives.

CPU has one real device, so the CPU tests put the frozen head (or embedding) on ``meta``: a second device on
which tensors keep shapes but no values. Mixing it with the CPU rows raised "expected all tensors to be on the
same device" before the rows were moved; the values and gradients of a real split are checked on CUDA (the
base on the GPU, the head on the CPU), which runs only where a GPU is present.
"""

from __future__ import annotations

import copy

import pytest
import torch
from peft import get_peft_model

import peft_grounded
from peft_grounded import GroundedTokenConfig
from peft_grounded.adapter.layer import on_device_of

META = torch.device("meta")


def untied(tokenizer, tiny_model_factory):
    base = tiny_model_factory("llama", False)
    new = peft_grounded.add_sid_tokens(tokenizer, base, [4, 4])
    model = get_peft_model(base, GroundedTokenConfig(token_indices=new, init="random"))
    return model, new


def test_on_device_of_moves_rows_and_keeps_their_gradient():
    rows = torch.randn(3, 4, requires_grad=True)
    target = torch.zeros(10, 4, dtype=torch.bfloat16)
    moved = on_device_of(rows, target)
    assert (moved.device, moved.dtype) == (target.device, torch.bfloat16)
    moved.float().sum().backward()
    assert rows.grad is not None and rows.grad.dtype == torch.float32
    assert on_device_of(rows, target.to(META)).device == META


@pytest.mark.parametrize("trainable_head", [False, True])  # the fused overlay, and plain autograd
def test_head_on_another_device_computes_there(tokenizer, tiny_model_factory, trainable_head):
    model, _ = untied(tokenizer, tiny_model_factory)
    head = model.get_base_model().lm_head
    layer = model.get_input_embeddings()
    assert layer.grounded_head["default"].device.type == "cpu"  # the rows stay with the embedding
    head.base_layer.to(META)
    head.base_layer.weight.requires_grad_(trainable_head)
    hidden = torch.randn(2, 3, head.base_layer.in_features)
    logits = head(hidden)
    assert logits.device == META and logits.shape == (2, 3, head.base_layer.out_features)
    weight = head.weight  # TRL's fused loss reads it
    assert weight.device == META and weight.shape == head.base_layer.weight.shape


def test_merge_into_a_head_on_another_device(tokenizer, tiny_model_factory):
    model, _ = untied(tokenizer, tiny_model_factory)
    model.get_base_model().lm_head.base_layer.to(META)
    model.merge_adapter()
    assert model.get_input_embeddings().merged


def test_embedding_output_on_another_device_than_its_rows(tokenizer, tiny_model_factory):
    model, new = untied(tokenizer, tiny_model_factory)
    layer = model.get_input_embeddings()
    layer.base_layer.to(META)  # the frozen matrix moved after the rows were made
    out = layer(torch.tensor([[1, new[0], new[5]]]))
    assert out.device == META and out.shape == (1, 3, layer.base_layer.embedding_dim)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a real split needs a GPU next to the CPU")
def test_split_model_matches_one_device_and_trains_the_head_rows(tokenizer, tiny_model_factory):
    model, new = untied(tokenizer, tiny_model_factory)
    reference = copy.deepcopy(model)
    model.get_base_model().model.to(
        "cuda"
    )  # decoder, embedding and its rows on the GPU; the head stays on CPU
    ids = torch.tensor([[1, 5, new[0], new[6], 9]])
    logits = model(input_ids=ids.cuda()).logits
    assert logits.device.type == "cpu"
    torch.testing.assert_close(logits, reference(input_ids=ids).logits, rtol=1e-4, atol=1e-4)
    logits[..., new].sum().backward()
    rows = model.get_input_embeddings().grounded_head["default"]
    assert rows.device.type == "cuda" and rows.grad is not None and rows.grad.abs().sum() > 0


def test_offloaded_head_takes_the_plain_path_with_the_same_logits(tokenizer, tiny_model_factory, monkeypatch):
    from types import SimpleNamespace

    from peft_grounded.adapter.layer import _OverlayColumns

    model, _ = untied(tokenizer, tiny_model_factory)
    head = model.get_base_model().lm_head
    hidden = torch.randn(2, 3, head.base_layer.in_features)
    fused = head(hidden)
    head.base_layer._hf_hook = SimpleNamespace(offload=True)  # what accelerate's offload hook carries
    calls = []
    original = _OverlayColumns.apply
    monkeypatch.setattr(_OverlayColumns, "apply", lambda *a: calls.append(a) or original(*a))
    plain = head(hidden)
    assert not calls  # an offloaded weight is only real inside the head's own forward
    torch.testing.assert_close(plain, fused)
