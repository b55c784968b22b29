"""Precision: half-precision init tensors in configs, float32 master weights on every path, integer indices."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch
from peft import PeftModel, get_peft_model
from peft.tuners.lora import LoraLayer

import peft_grounded
from peft_grounded import GroundedTokenConfig
from peft_grounded.adapter.config import describe_tensor

HALF = [torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", HALF)
def test_half_precision_init_vectors_save(tokenizer, tiny_model_factory, tmp_path, dtype):
    model = tiny_model_factory("llama", True)
    new = peft_grounded.add_sid_tokens(tokenizer, model, [4])
    vectors = torch.randn(len(new), 24).to(dtype)
    config = GroundedTokenConfig(token_indices=new, init="centroid", init_vectors=vectors)
    name = str(dtype).removeprefix("torch.")
    assert describe_tensor(vectors).startswith(f"in-memory {name}[4, 24] sha256=")
    get_peft_model(model, config).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "adapter_config.json").read_text())
    record = saved["provenance"]["init_data"]["init_vectors"]
    assert record == describe_tensor(vectors)
    changed = vectors.clone()
    changed[0, 0] += 1
    assert describe_tensor(changed) != record


def test_float32_description_is_unchanged():
    vectors = torch.randn(3, 5)
    digest = hashlib.sha256(vectors.numpy().tobytes()).hexdigest()[:16]
    assert describe_tensor(vectors) == f"in-memory float32[3, 5] sha256={digest}"


@pytest.mark.parametrize("indices", [[10.0, 11.7], [10.0, 11.0], [10, 11.5], [True, 11], ["10", "11"]])
def test_non_integer_token_indices_are_refused(indices):
    with pytest.raises(ValueError, match="token_indices must be integer row indices"):
        GroundedTokenConfig(token_indices=indices)
    with pytest.raises(ValueError, match="integer row indices"):
        GroundedTokenConfig(token_indices=torch.tensor([10.0, 11.0]))


def test_integer_token_indices_of_any_integer_type():
    for indices in ([10, 11], np.array([10, 11]), torch.tensor([10, 11]), (np.int32(10), np.int64(11))):
        assert GroundedTokenConfig(token_indices=indices).token_indices == [10, 11]


def adapter_weights(model) -> dict[str, torch.Tensor]:
    return {n: p for n, p in model.named_parameters() if "grounded_" in n or "lora_" in n}


def assert_float32_and_trains(model, new, names=None):
    weights = adapter_weights(model)
    if names is not None:
        weights = {n: p for n, p in weights.items() if any(f".{a}" in n for a in names)}
    assert any("lora_" in n for n in weights) and any("grounded_" in n for n in weights)
    assert {n: p.dtype for n, p in weights.items() if p.dtype != torch.float32} == {}
    ids = torch.tensor([[1, 17, new[0], 400, new[5], 9]])
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    trainable = [p for p in weights.values() if p.requires_grad]
    assert torch.isfinite(loss) and trainable
    bad = [
        n
        for n, p in weights.items()
        if p.requires_grad and (p.grad is None or not torch.isfinite(p.grad).all())
    ]
    assert bad == []
    model.zero_grad()


@pytest.mark.parametrize("dtype", HALF)
def test_every_adapter_weight_is_float32_on_every_path(tokenizer, tiny_model_factory, tmp_path, dtype):
    from transformers import AutoTokenizer

    def base_and_tokens():
        base = tiny_model_factory("llama", False, dtype=dtype)
        return base, peft_grounded.add_sid_tokens(
            AutoTokenizer.from_pretrained(tokenizer.name_or_path), base, [4, 4]
        )

    base, new = base_and_tokens()  # get_peft_model with a LoRA in the config
    config = GroundedTokenConfig(token_indices=new, lora={"r": 2, "target_modules": ["q_proj", "v_proj"]})
    assert_float32_and_trains(get_peft_model(base, config), new)

    base, new = base_and_tokens()  # add_lora on a grounded adapter
    model = get_peft_model(base, GroundedTokenConfig(token_indices=new, init="random"))
    peft_grounded.add_lora(model, r=2, target_modules="all-linear")
    assert_float32_and_trains(model, new)
    model.save_pretrained(tmp_path / "stacked")

    base, new = base_and_tokens()  # PeftModel.from_pretrained, trainable
    loaded = PeftModel.from_pretrained(base, tmp_path / "stacked", is_trainable=True)
    assert_float32_and_trains(loaded, new)
    loaded.load_adapter(tmp_path / "stacked", adapter_name="second", is_trainable=True)  # load_adapter
    loaded.set_adapter("second")
    assert all(m.active_adapters == ["second"] for m in loaded.modules() if isinstance(m, LoraLayer))
    assert_float32_and_trains(loaded, new, names=["second"])


@pytest.mark.parametrize("dtype", HALF)
def test_unmerge_restores_half_precision_rows(tokenizer, tiny_model_factory, dtype):
    base = tiny_model_factory("llama", False, dtype=dtype)
    new = peft_grounded.add_sid_tokens(tokenizer, base, [4])
    before = {k: v.clone() for k, v in base.state_dict().items()}
    model = get_peft_model(base, GroundedTokenConfig(token_indices=new, init="random"))
    model.merge_adapter()
    assert not torch.equal(base.lm_head.base_layer.weight, before["lm_head.weight"])
    model.unmerge_adapter()
    assert torch.equal(base.lm_head.base_layer.weight, before["lm_head.weight"])
    assert torch.equal(base.model.embed_tokens.base_layer.weight, before["model.embed_tokens.weight"])
