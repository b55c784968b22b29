"""Stacking a LoRA on a grounded adapter: rows start grounded, stay trainable, one artefact saved and reloaded."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset
from peft import PeftModel, get_peft_model
from peft.tuners.lora import LoraLayer
from trl import SFTConfig, SFTTrainer

import peft_grounded
from peft_grounded import GroundedTokenConfig


def sft_dataset(n=8):
    return Dataset.from_list(
        [
            {
                "prompt": f"User history <a_{i % 4}><b_{i % 3}> next:",
                "completion": f" <a_{(i + 1) % 4}><b_{i % 2}>",
            }
            for i in range(n)
        ]
    )


@pytest.mark.parametrize("tied", [True, False])
def test_grounded_adapter_to_lora_sft_and_back(tokenizer, tiny_model_factory, tmp_path, tied):
    def fresh_base():
        base = tiny_model_factory("llama", tied)
        return base, peft_grounded.add_sid_tokens(tokenizer_copy(), base, [4, 4])

    def tokenizer_copy():
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(tokenizer.name_or_path)

    base, new = fresh_base()
    grounded = get_peft_model(
        base, GroundedTokenConfig(token_indices=new, init="random", task_type="CAUSAL_LM")
    )
    with torch.no_grad():  # stand-in for the grounding stage: rows away from their initial values
        for p in grounded.parameters():
            if p.requires_grad:
                p.add_(0.1)
    grounded.save_pretrained(tmp_path / "grounded")
    rows = grounded.get_input_embeddings().grounded_embedding["default"].detach().clone()

    base2, _ = fresh_base()
    model = PeftModel.from_pretrained(base2, tmp_path / "grounded", is_trainable=True)
    peft_grounded.add_lora(model, r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    layer = model.get_input_embeddings()
    assert torch.equal(layer.grounded_embedding["default"], rows)
    lora_layers = [m for m in model.modules() if isinstance(m, LoraLayer)]
    assert len(lora_layers) == 2 * model.get_base_model().config.num_hidden_layers
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert any("lora_A" in n for n in trainable) and any("grounded_embedding" in n for n in trainable)
    assert ("grounded_head" in " ".join(trainable)) == (not tied)

    tok = tokenizer_copy()
    peft_grounded.add_sid_tokens(tok, tiny_model_factory("llama", tied), [4, 4])
    args = SFTConfig(
        output_dir=str(tmp_path / "sft"),
        max_steps=2,
        per_device_train_batch_size=4,
        learning_rate=5e-2,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        max_length=64,
        disable_tqdm=True,
        bf16=False,  # fp32 on CPU: accelerate would keep autocasting the forward afterwards
    )
    SFTTrainer(model=model, args=args, train_dataset=sft_dataset(), processing_class=tok).train()
    assert not torch.equal(layer.grounded_embedding["default"], rows)
    assert any(m.lora_B["default"].weight.abs().sum() > 0 for m in lora_layers)

    model.save_pretrained(tmp_path / "stacked")
    model.eval()  # LoRA dropout off
    ids = torch.tensor([[1, 5, new[0], new[5], 9]])
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    base3, _ = fresh_base()
    reloaded = PeftModel.from_pretrained(base3, tmp_path / "stacked")
    assert reloaded.peft_config["default"].lora == {
        "r": 4,
        "lora_alpha": 8,
        "lora_dropout": 0.0,
        "target_modules": ["q_proj", "v_proj"],
    }
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=ids).logits, expected)
        merged = reloaded.merge_and_unload()
        torch.testing.assert_close(merged(input_ids=ids).logits, expected, rtol=1e-4, atol=1e-4)


def test_add_lora_refuses_twice_and_other_adapters(tokenizer, tiny_model_factory):
    base = tiny_model_factory("llama", True)
    new = peft_grounded.add_sid_tokens(tokenizer, base, [4])
    model = get_peft_model(base, GroundedTokenConfig(token_indices=new))
    with pytest.raises(ValueError, match="matched no module"):
        peft_grounded.add_lora(model, target_modules=["no_such_proj"])
    assert model.peft_config["default"].lora is None  # a refused LoRA leaves no trace in the saved config
    with pytest.raises(ValueError, match="does not take"):
        peft_grounded.add_lora(model, no_such_option=1)
    assert model.peft_config["default"].lora is None
    peft_grounded.add_lora(model, r=2, target_modules="all-linear")
    assert not isinstance(model.get_base_model().lm_head.base_layer, LoraLayer)
    with pytest.raises(ValueError, match="already has a LoRA"):
        peft_grounded.add_lora(model)


def test_lora_in_a_fresh_config(tokenizer, tiny_model_factory):
    base = tiny_model_factory("qwen3", False, extra_rows=64)
    new = peft_grounded.add_sid_tokens(tokenizer, base, [4])
    model = get_peft_model(
        base,
        GroundedTokenConfig(
            token_indices=new, lora={"r": 2, "target_modules": "all-linear"}, task_type="CAUSAL_LM"
        ),
    )
    names = [n for n, m in model.named_modules() if isinstance(m, LoraLayer)]
    assert names and not any("lm_head" in n or "embed_tokens" in n for n in names)


def test_set_adapter_switches_the_stacked_lora_too(tokenizer, tiny_model_factory, tmp_path):
    base = tiny_model_factory("llama", True)
    new = peft_grounded.add_sid_tokens(tokenizer, base, [4])
    config = GroundedTokenConfig(token_indices=new, lora={"r": 2, "target_modules": ["q_proj"]})
    model = get_peft_model(base, config)
    model.save_pretrained(tmp_path)
    model.load_adapter(tmp_path, adapter_name="second", is_trainable=True)
    model.set_adapter("second")
    lora_layers = [m for m in model.modules() if isinstance(m, LoraLayer)]
    assert lora_layers and all(m.active_adapters == ["second"] for m in lora_layers)
    assert model.get_input_embeddings().active_adapters == ["second"]
    assert all(m.lora_A["second"].weight.requires_grad for m in lora_layers)
    assert not any(m.lora_A["default"].weight.requires_grad for m in lora_layers)


def test_lora_options_beyond_the_four_reach_the_layers(tokenizer, tiny_model_factory):
    base = tiny_model_factory("llama", True)
    new = peft_grounded.add_sid_tokens(tokenizer, base, [4])
    model = get_peft_model(base, GroundedTokenConfig(token_indices=new))
    peft_grounded.add_lora(
        model,
        r=2,
        lora_alpha=4,
        target_modules=["q_proj", "v_proj"],
        use_rslora=True,
        rank_pattern={"v_proj": 3},
    )
    layers = {n: m for n, m in model.named_modules() if isinstance(m, LoraLayer)}
    q = next(m for n, m in layers.items() if n.endswith("q_proj"))
    v = next(m for n, m in layers.items() if n.endswith("v_proj"))
    assert (q.r["default"], v.r["default"]) == (2, 3)
    assert q.scaling["default"] == pytest.approx(4 / 2**0.5)  # rsLoRA: alpha / sqrt(r)
    assert model.peft_config["default"].lora["use_rslora"] is True


def test_lora_field_is_checked():
    with pytest.raises(ValueError, match="needs target_modules"):
        GroundedTokenConfig(token_indices=[10], lora={"r": 2})
    with pytest.raises(ValueError, match="does not take"):
        GroundedTokenConfig(token_indices=[10], lora={"r": 2, "target_modules": "all-linear", "rank": 3})
    with pytest.raises(ValueError, match="task_type"):
        GroundedTokenConfig(
            token_indices=[10], lora={"r": 2, "target_modules": "all-linear", "task_type": "X"}
        )
    with pytest.raises(ValueError, match="bias"):
        GroundedTokenConfig(token_indices=[10], lora={"r": 2, "target_modules": "all-linear", "bias": "all"})
    with pytest.raises(ValueError, match="init_lora_weights"):
        GroundedTokenConfig(
            token_indices=[10], lora={"r": 2, "target_modules": "all-linear", "init_lora_weights": "pissa"}
        )
    with pytest.raises(TypeError, match="dict"):
        GroundedTokenConfig(token_indices=[10], lora=2)
    with pytest.raises(TypeError, match="lora_r"):  # one way to give a LoRA: the lora dict
        GroundedTokenConfig(token_indices=[10], lora_r=2)
