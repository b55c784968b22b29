"""The grounded-token adapter as a PEFT method: registration, parameters, save/load, merge, adapters, dtypes."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from peft import PeftConfig, get_peft_model
from safetensors import safe_open

import peft_grounded
from peft_grounded import GroundedTokenConfig
from peft_grounded.adapter import GroundedHead, GroundedTokenLayer

CASES = [("llama", True), ("llama", False), ("qwen3", True), ("qwen3", False)]


def adapted(
    tokenizer, factory, arch="llama", tied=True, codes=(8, 8), init="gaussian", dtype=torch.float32, **kw
):
    model = factory(arch, tied, extra_rows=64 if arch == "qwen3" else 0, dtype=dtype)
    new = peft_grounded.add_sid_tokens(tokenizer, model, list(codes))
    config = GroundedTokenConfig(token_indices=new, init=init, task_type="CAUSAL_LM", **kw)
    return get_peft_model(model, config), new


def batch(new, n=3):
    ids = torch.tensor(
        [[1, 17, new[0], new[-1], 400, new[n], 9, new[2 * n]], [5, new[1], 300, 301, new[-2], 7, 8, 2]]
    )
    return {"input_ids": ids, "labels": ids.clone()}


def test_registered_with_peft():
    assert peft_grounded.GROUNDED_TOKENS == "GROUNDED_TOKENS"
    from peft.mapping import PEFT_TYPE_TO_CONFIG_MAPPING, PEFT_TYPE_TO_TUNER_MAPPING

    assert PEFT_TYPE_TO_CONFIG_MAPPING["GROUNDED_TOKENS"] is GroundedTokenConfig
    assert PEFT_TYPE_TO_TUNER_MAPPING["GROUNDED_TOKENS"] is peft_grounded.GroundedTokenModel


def test_every_config_field_survives_json(tmp_path):
    config = GroundedTokenConfig(
        token_indices=[10, 11, 12],
        token_strings=["<a_0>", "<a_1>", "<b_0>"],
        original_vocab_size=10,
        init="description",
        init_texts=[[1, 2], [3], [4, 5, 6]],
        init_seed=7,
        centroid_projection="pca",
        norm_match=False,
        lora={"r": 4, "lora_alpha": 8, "lora_dropout": 0.1, "target_modules": ["q_proj", "v_proj"]},
        train_output_rows=False,
        output_module="lm_head",
        task_type="CAUSAL_LM",
        init_weights=False,
        provenance={
            "num_embeddings": 20,
            "embedding_signature": [1.0, 2.0],
            "vocab_fingerprint": "sha256:abc",
        },
    )
    config.record_start()
    config.save_pretrained(tmp_path)
    loaded = PeftConfig.from_pretrained(tmp_path)
    assert isinstance(loaded, GroundedTokenConfig)
    for f in dataclasses.fields(GroundedTokenConfig):
        if f.name != "runtime_config":  # runtime data: never saved
            assert getattr(loaded, f.name) == getattr(config, f.name), f.name
    assert loaded.provenance.init_data == {"init_texts": [[1, 2], [3], [4, 5, 6]]}
    assert GroundedTokenConfig.from_pretrained(tmp_path).runtime_config.rows_from_checkpoint


@pytest.mark.parametrize(("arch", "tied"), CASES)
def test_only_new_rows_are_trainable(tokenizer, tiny_model_factory, arch, tied):
    model, new = adapted(tokenizer, tiny_model_factory, arch, tied)
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    d = model.get_base_model().config.hidden_size
    expected = len(new) * d * (1 if tied else 2)
    assert sum(p.numel() for p in trainable.values()) == expected
    assert model.get_nb_trainable_parameters()[0] == expected
    assert all(".grounded_" in n for n in trainable)
    assert isinstance(model.get_input_embeddings(), GroundedTokenLayer)
    assert isinstance(model.get_output_embeddings(), GroundedHead)


@pytest.mark.parametrize(("arch", "tied"), CASES)
def test_save_writes_only_new_rows_even_in_auto_mode(tokenizer, tiny_model_factory, tmp_path, arch, tied):
    base_dir = tmp_path / "base"
    tiny_model_factory(arch, tied, extra_rows=64 if arch == "qwen3" else 0).save_pretrained(base_dir)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir)  # a local base: PEFT's "auto" sees a resized vocab
    new = peft_grounded.add_sid_tokens(tokenizer, model, [256, 256])
    peft_model = get_peft_model(model, GroundedTokenConfig(token_indices=new, task_type="CAUSAL_LM"))
    peft_model.save_pretrained(
        tmp_path / "adapter"
    )  # save_embedding_layers="auto", as Trainer and push_to_hub
    path = tmp_path / "adapter" / "adapter_model.safetensors"
    with safe_open(str(path), "pt") as handle:
        shapes = {k: handle.get_slice(k).get_shape() for k in handle.keys()}  # noqa: SIM118
    d = model.config.hidden_size
    assert sorted(shapes.values()) == [[512, d]] * (1 if tied else 2)
    assert os.path.getsize(path) <= 1.05 * 512 * d * 4 * (1 if tied else 2)


@pytest.mark.parametrize(("arch", "tied"), [("llama", True), ("qwen3", False)])
def test_save_then_load_in_a_new_process_gives_identical_logits(
    tokenizer, tiny_model_factory, tmp_path, arch, tied
):
    model, new = adapted(tokenizer, tiny_model_factory, arch, tied)
    with torch.no_grad():  # move the rows away from their initial values
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p))
    model.save_pretrained(tmp_path / "adapter")
    inputs = batch(new)["input_ids"]
    with torch.no_grad():
        expected = model(input_ids=inputs).logits
    torch.save({"inputs": inputs, "logits": expected}, tmp_path / "expected.pt")
    tiny_model_factory(arch, tied, extra_rows=64 if arch == "qwen3" else 0).save_pretrained(tmp_path / "base")
    script = textwrap.dedent(
        f"""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from peft import PeftModel
        import peft_grounded
        from peft_grounded import assets
        tokenizer = AutoTokenizer.from_pretrained(assets.smollm2())
        base = AutoModelForCausalLM.from_pretrained({str(tmp_path / "base")!r}).eval()
        peft_grounded.add_sid_tokens(tokenizer, base, [8, 8])
        model = PeftModel.from_pretrained(base, {str(tmp_path / "adapter")!r})
        expected = torch.load({str(tmp_path / "expected.pt")!r})
        with torch.no_grad():
            logits = model(input_ids=expected["inputs"]).logits
        assert torch.equal(logits, expected["logits"]), (logits - expected["logits"]).abs().max()
        print("IDENTICAL")
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert "IDENTICAL" in result.stdout, result.stderr[-3000:]


@pytest.mark.parametrize(("arch", "tied"), CASES)
def test_merge_unmerge_disable(tokenizer, tiny_model_factory, arch, tied):
    model, new = adapted(tokenizer, tiny_model_factory, arch, tied)
    base = model.get_base_model()
    before = {k: v.clone() for k, v in base.state_dict().items()}
    inputs = batch(new)["input_ids"]
    with torch.no_grad():
        with model.disable_adapter():
            base_logits = model(input_ids=inputs).logits
        adapter_logits = model(input_ids=inputs).logits
        model.merge_adapter()
        merged_logits = model(input_ids=inputs).logits
        model.unmerge_adapter()
        after = base.state_dict()
        assert all(torch.equal(before[k], after[k]) for k in before)
        with model.disable_adapter():
            assert torch.equal(model(input_ids=inputs).logits, base_logits)
        assert not torch.allclose(adapter_logits, base_logits)
        torch.testing.assert_close(merged_logits, adapter_logits, rtol=1e-5, atol=1e-5)
        unloaded = model.merge_and_unload()
        assert not isinstance(unloaded.get_input_embeddings(), GroundedTokenLayer)
        assert not isinstance(unloaded.get_output_embeddings(), GroundedHead)
        assert (unloaded.lm_head.weight is unloaded.model.embed_tokens.weight) == tied
        torch.testing.assert_close(unloaded(input_ids=inputs).logits, adapter_logits, rtol=1e-5, atol=1e-5)
        unloaded.resize_token_embeddings(unloaded.get_input_embeddings().weight.shape[0] + 8)  # allowed again


def test_several_adapters_on_disjoint_tokens(tokenizer, tiny_model_factory):
    model = tiny_model_factory("llama", False)
    first = peft_grounded.add_tokens(tokenizer, model, ["<x_0>", "<x_1>", "<x_2>"])
    second = peft_grounded.add_tokens(tokenizer, model, ["<y_0>", "<y_1>"])
    peft_model = get_peft_model(model, GroundedTokenConfig(token_indices=first, init="random", init_seed=1))
    peft_model.add_adapter("second", GroundedTokenConfig(token_indices=second, init="random", init_seed=2))
    ids = torch.tensor([[1, first[0], second[1], 5]])
    with torch.no_grad():
        only_first = peft_model(input_ids=ids).logits
        peft_model.base_model.set_adapter(["default", "second"])
        both = peft_model(input_ids=ids).logits
        peft_model.set_adapter("second")
        only_second = peft_model(input_ids=ids).logits
    assert not torch.equal(only_first, both) and not torch.equal(only_second, both)
    layer = peft_model.get_input_embeddings()
    assert set(layer.grounded_embedding) == {"default", "second"}
    peft_model.add_adapter("third", GroundedTokenConfig(token_indices=[first[0], 7], tokens_are_new=False))
    peft_model.base_model.set_adapter(["default", "third"])
    with pytest.raises(ValueError, match="disjoint"):
        peft_model(input_ids=ids)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tied", [True, False])
def test_dtypes_train_and_merge(tokenizer, tiny_model_factory, dtype, tied):
    model, new = adapted(tokenizer, tiny_model_factory, "llama", tied, dtype=dtype)
    deltas = [p for p in model.parameters() if p.requires_grad]
    assert all(p.dtype == torch.float32 for p in deltas)  # PEFT upcasts adapter weights
    loss = model(**batch(new)).loss
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None and torch.isfinite(p.grad).all() for p in deltas)
    inputs = batch(new)["input_ids"]
    with torch.no_grad():
        adapter_logits = model(input_ids=inputs).logits
        merged = model.merge_and_unload()
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(merged(input_ids=inputs).logits, adapter_logits, rtol=tol, atol=tol)


def test_gradient_checkpointing(tokenizer, tiny_model_factory):
    model, new = adapted(tokenizer, tiny_model_factory, "llama", False)
    reference = {n: None for n, p in model.named_parameters() if p.requires_grad}
    model(**batch(new)).loss.backward()
    for n, p in model.named_parameters():
        if p.requires_grad:
            reference[n] = p.grad.clone()
            p.grad = None
    model.train()
    base = model.get_base_model()
    base.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    assert base.is_activation_checkpointing
    model.enable_input_require_grads()
    model(**batch(new)).loss.backward()
    for n, p in model.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(p.grad, reference[n], rtol=1e-5, atol=1e-6)


def test_load_adapter_by_name(tokenizer, tiny_model_factory, tmp_path):
    model, _new = adapted(tokenizer, tiny_model_factory, "llama", True)
    model.save_pretrained(tmp_path / "a")
    model.load_adapter(tmp_path / "a", adapter_name="reloaded")
    layer = model.get_input_embeddings()
    assert torch.equal(layer.grounded_embedding["reloaded"], layer.grounded_embedding["default"])
