"""Training the new rows: exact gradients, frozen base, no full-vocabulary state, and TRL's SFTTrainer."""

from __future__ import annotations

import copy

import pytest
import torch
from datasets import Dataset
from peft import get_peft_model
from trl import SFTConfig, SFTTrainer
from trl.trainer.utils import add_fused_lm_head

import peft_grounded
from peft_grounded import GroundedTokenConfig
from peft_grounded.sid_head import compact_head

CASES = [("llama", True), ("llama", False), ("qwen3", True), ("qwen3", False)]


def setup(tokenizer, factory, arch, tied, codes=(8, 8)):
    base = factory(arch, tied, extra_rows=64 if arch == "qwen3" else 0)
    new = peft_grounded.add_sid_tokens(tokenizer, base, list(codes))
    reference = copy.deepcopy(base)
    model = get_peft_model(
        base, GroundedTokenConfig(token_indices=new, init="gaussian", task_type="CAUSAL_LM")
    )
    layer = model.get_input_embeddings()
    index = torch.as_tensor(new)
    with torch.no_grad():  # the reference starts from the adapter's initial rows
        reference.get_input_embeddings().weight[index] = layer.grounded_embedding["default"]
        if not tied:
            reference.get_output_embeddings().weight[index] = layer.grounded_head["default"]
    return model, reference, new


def batch(new):
    ids = torch.tensor(
        [[1, 17, new[0], new[-1], 400, new[3], 9, new[6]], [5, new[1], 300, 301, new[-2], 7, 8, 2]]
    )
    return {"input_ids": ids, "labels": ids.clone()}


def adapter_grads(model):
    layer = model.get_input_embeddings()
    out = {"input": layer.grounded_embedding["default"].grad}
    if "default" in layer.grounded_head:
        out["output"] = layer.grounded_head["default"].grad
    return out


def reference_grads(reference, new, tied):
    index = torch.as_tensor(new)
    out = {"input": reference.get_input_embeddings().weight.grad[index]}
    if not tied:
        out["output"] = reference.get_output_embeddings().weight.grad[index]
    return out


@pytest.mark.parametrize(("arch", "tied"), CASES)
def test_gradients_equal_full_embedding_training(tokenizer, tiny_model_factory, arch, tied):
    model, reference, new = setup(tokenizer, tiny_model_factory, arch, tied)
    model(**batch(new)).loss.backward()
    reference(**batch(new)).loss.backward()
    ours, theirs = adapter_grads(model), reference_grads(reference, new, tied)
    assert ours.keys() == theirs.keys()
    for key in ours:
        torch.testing.assert_close(ours[key], theirs[key], rtol=1e-4, atol=1e-6)
        assert ours[key].abs().sum() > 0


@pytest.mark.parametrize(("arch", "tied"), [("llama", True), ("qwen3", False)])
def test_gradients_equal_under_trl_fused_head(tokenizer, tiny_model_factory, arch, tied):
    """TRL computes its loss from ``lm_head.weight``: the adapter's rows must get the same gradient there."""
    model, reference, new = setup(tokenizer, tiny_model_factory, arch, tied)
    add_fused_lm_head(model.get_base_model())
    add_fused_lm_head(reference)
    model(**batch(new), fused_lm_head=True).loss.backward()
    reference(**batch(new), fused_lm_head=True).loss.backward()
    ours, theirs = adapter_grads(model), reference_grads(reference, new, tied)
    for key in ours:
        torch.testing.assert_close(ours[key], theirs[key], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(("arch", "tied"), [("llama", False), ("qwen3", True)])
def test_training_leaves_base_bit_identical_and_small_state(tokenizer, tiny_model_factory, arch, tied):
    model, _, new = setup(tokenizer, tiny_model_factory, arch, tied)
    base = model.get_base_model()
    frozen = {k: v.clone() for k, v in base.state_dict().items() if ".grounded_" not in k}
    rows = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    for _ in range(3):
        model(**batch(new)).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
    vocab = base.config.vocab_size
    for name, param in model.named_parameters():
        assert (param.grad is not None) == param.requires_grad, name
        if param.requires_grad:
            assert param.shape[0] == len(new) < vocab
            assert not torch.equal(param.detach(), rows[name]), f"{name} did not train"
    state = [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t) and t.ndim]
    assert state and all(t.shape[0] == len(new) for t in state)
    after = base.state_dict()
    assert all(torch.equal(frozen[k], after[k]) for k in frozen)


def grounding_dataset(n=12):
    return Dataset.from_list(
        [
            {
                "prompt": [{"role": "user", "content": f"Which item is called thing number {i}?"}],
                "completion": [{"role": "assistant", "content": f"<a_{i % 8}><b_{(3 * i) % 8}>"}],
            }
            for i in range(n)
        ]
    )


@pytest.mark.parametrize("tied", [True, False])
def test_trains_inside_trl_sft_trainer(tokenizer, tiny_model_factory, tmp_path, tied):
    model, _, _new = setup(tokenizer, tiny_model_factory, "llama", tied)
    base = model.get_base_model()
    frozen = {k: v.clone() for k, v in base.state_dict().items() if ".grounded_" not in k}
    layer = model.get_input_embeddings()
    before = {k: v.detach().clone() for k, v in layer.grounded_embedding.items()}
    head_before = {k: v.detach().clone() for k, v in layer.grounded_head.items()}
    args = SFTConfig(
        output_dir=str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=4,
        learning_rate=5e-2,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        max_length=64,
        logging_steps=1,
        disable_tqdm=True,
    )
    trainer = SFTTrainer(
        model=model, args=args, train_dataset=grounding_dataset(), processing_class=tokenizer
    )
    trainer.train()
    assert not torch.equal(layer.grounded_embedding["default"], before["default"])
    head_rows = layer.grounded_embedding if tied else layer.grounded_head
    assert set(head_rows) == {"default"}
    if not tied:
        assert not torch.equal(layer.grounded_head["default"], head_before["default"])
    after = base.state_dict()
    assert all(torch.equal(frozen[k], after[k]) for k in frozen)


@pytest.mark.parametrize(("arch", "tied"), [("llama", False), ("qwen3", True)])
def test_compact_head_equals_trl_fused_head(tokenizer, tiny_model_factory, arch, tied):
    """The compact path (labelled positions only) gives TRL's per-token log-probs, loss and gradients."""
    model, _, new = setup(tokenizer, tiny_model_factory, arch, tied)
    add_fused_lm_head(model.get_base_model(), outputs=("log_probs", "entropy", "is_top1"))
    inputs = batch(new)
    inputs["labels"][:, :4] = -100  # a prompt: only the completion is scored
    full = model(**inputs, fused_lm_head=True)
    full.loss.backward()
    expected = {k: v.clone() for k, v in adapter_grads(model).items()}
    model.zero_grad()
    with compact_head(model):
        compact = model(**inputs, fused_lm_head=True)
    compact.loss.backward()
    torch.testing.assert_close(compact.log_probs, full.log_probs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(compact.entropy, full.entropy, rtol=1e-4, atol=1e-4)
    assert torch.equal(compact.is_top1, full.is_top1) and torch.equal(compact.label_mask, full.label_mask)
    for key, grad in adapter_grads(model).items():
        torch.testing.assert_close(grad, expected[key], rtol=1e-4, atol=1e-6)


def test_compact_head_leaves_router_logits_requests_to_trl(tokenizer):
    """TRL asks MoE models for router logits and adds their load-balancing loss from its own output."""
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    torch.manual_seed(0)
    config = Qwen3MoeConfig(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_experts=4,
        num_experts_per_tok=2,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    base = AutoModelForCausalLM.from_config(config)
    new = peft_grounded.add_sid_tokens(tokenizer, base, [8, 8])
    model = get_peft_model(base, GroundedTokenConfig(token_indices=new, task_type="CAUSAL_LM"))
    add_fused_lm_head(model.get_base_model(), outputs=("log_probs", "entropy", "is_top1"))
    with compact_head(model):
        out = model(**batch(new), fused_lm_head=True, output_router_logits=True)
    assert out.aux_loss is not None  # TRL's path: the compact one has no router loss to give
