"""The adapter's side of sharded training, in one process: what it refuses, and which modules share an FSDP unit.

The sharded runs themselves (FSDP2, DeepSpeed ZeRO-3, two nodes) are in tests/test_sharded_*.py (multiproc).
"""

from __future__ import annotations

import pytest
from peft import get_peft_model

import peft_grounded
from peft_grounded import GroundedTokenConfig
from peft_grounded.adapter.layer import GroundedHead, GroundedTokenLayer
from peft_grounded.adapter.sharding import grounded_modules, shard_grounded_layers


def wrapped(tokenizer, tiny_model_factory, tied: bool):
    base = tiny_model_factory("llama", tied)
    new = peft_grounded.add_sid_tokens(tokenizer, base, [4, 4])
    return get_peft_model(base, GroundedTokenConfig(token_indices=new, task_type="CAUSAL_LM"))


@pytest.mark.parametrize("tied", [True, False])
def test_the_rows_and_their_readers_form_one_unit(tokenizer, tiny_model_factory, tied):
    model = wrapped(tokenizer, tiny_model_factory, tied)
    modules = grounded_modules(model)
    assert [type(m) for m in modules] == [GroundedTokenLayer, GroundedHead]
    assert modules[0] is model.get_input_embeddings() and modules[1] is model.get_output_embeddings()
    held = {id(p) for m in modules for p in m.parameters()}
    rows = [p for n, p in model.named_parameters() if ".grounded_" in n]
    assert len(rows) == (1 if tied else 2) and all(id(p) in held for p in rows)
    head_weight = model.get_output_embeddings().base_layer.weight
    assert id(head_weight) in held  # a tied head's weight is the embedding's: one unit holds it once


def test_a_base_loaded_on_meta_is_refused_with_the_fsdp_setting_to_change(tokenizer, tiny_model_factory):
    """accelerate's cpu_ram_efficient_loading leaves every process but the first with a model on ``meta``."""
    base = tiny_model_factory("llama", False)
    new = peft_grounded.add_sid_tokens(tokenizer, base, [4, 4])
    base.to("meta")
    with pytest.raises(ValueError, match="fsdp_cpu_ram_efficient_loading: false"):
        get_peft_model(base, GroundedTokenConfig(token_indices=new))
    assert type(base.get_input_embeddings()).__name__ == "Embedding"  # refused before the model was touched


def test_sharding_refuses_cpu_ram_efficient_loading(tokenizer, tiny_model_factory, monkeypatch):
    from accelerate.utils import FullyShardedDataParallelPlugin

    monkeypatch.setenv("FSDP_CPU_RAM_EFFICIENT_LOADING", "false")  # the plugin writes its value there
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, cpu_ram_efficient_loading=True)
    model = wrapped(tokenizer, tiny_model_factory, True)
    with pytest.raises(ValueError, match="fsdp_cpu_ram_efficient_loading: false"):
        shard_grounded_layers(model, plugin)
    assert type(model.get_input_embeddings()) is GroundedTokenLayer  # not sharded
