"""benchmarks/bench_step_limit.py: the products it times are the step's (every frozen linear layer of the
blocks, LoRA-wrapped ones by their base layer, the head left out), and its batches are the trainer's."""

from __future__ import annotations

import pytest
import torch
from conftest import build_tiny_model

from benchmarks import bench_step_limit


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_the_products_are_every_block_linear_layer(arch):
    model = build_tiny_model(arch, False)
    plain = bench_step_limit.linear_shapes(model)
    layers = model.config.num_hidden_layers
    assert len(plain) == 7 * layers  # q, k, v, o, gate, up, down per block; no head
    head = tuple(model.get_output_embeddings().weight.shape)
    assert head not in plain
    from peft import LoraConfig, get_peft_model

    wrapped = get_peft_model(model, LoraConfig(r=2, target_modules="all-linear"))
    assert bench_step_limit.linear_shapes(wrapped) == plain  # base layers, no LoRA factors
    tokens = 16
    flop = bench_step_limit.products_flop(plain, tokens)
    assert flop == sum(4 * tokens * o * i for o, i in plain)
    assert bench_step_limit.products_seconds(plain, tokens, torch.float32, repeats=1) > 0
    with pytest.raises(ValueError, match="no linear layer"):
        bench_step_limit.linear_shapes(torch.nn.Sequential(torch.nn.Linear(2, 2)))


def test_batches_are_cut_padded_and_labelled_as_the_trainer_does():
    long = bench_step_limit.MAX_LENGTH + 7
    rows = [
        {"input_ids": list(range(1, long + 1)), "completion_mask": [0, 1] * (long // 2) + [1]},
        {"input_ids": [5, 6, 7], "completion_mask": [0, 0, 1]},
    ]
    batch = bench_step_limit.collate(rows, pad_id=0)
    assert batch["input_ids"].shape == (2, bench_step_limit.MAX_LENGTH)
    assert bench_step_limit.real_tokens(batch) == bench_step_limit.MAX_LENGTH + 3
    assert batch["labels"][1].tolist()[:4] == [-100, -100, 7, -100]
    assert batch["labels"][0, 1].item() == 2 and batch["labels"][0, 0].item() == -100
    free = bench_step_limit.collate(rows, pad_id=0, padding_free=True)
    assert free["input_ids"].shape == (1, bench_step_limit.MAX_LENGTH + 3) and "attention_mask" not in free
    assert bench_step_limit.real_tokens(free) == bench_step_limit.MAX_LENGTH + 3
    assert free["position_ids"][0, bench_step_limit.MAX_LENGTH :].tolist() == [0, 1, 2]


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_a_padding_free_batch_has_the_padded_batch_loss(arch):
    """The benchmark's padding-free rows are what the padded rows compute: the same loss, on CPU attention."""
    model = build_tiny_model(arch, False).train()
    rows = [
        {"input_ids": [5, 6, 7, 8, 9, 10], "completion_mask": [0, 0, 1, 1, 1, 1]},
        {"input_ids": [11, 12, 13], "completion_mask": [0, 1, 1]},
        {"input_ids": [21, 22, 23, 24], "completion_mask": [0, 1, 1, 1]},
    ]
    padded = model(**bench_step_limit.collate(rows, 0), use_cache=False).loss
    free = model(**bench_step_limit.collate(rows, 0, padding_free=True), use_cache=False).loss
    assert free.item() == pytest.approx(padded.item(), abs=1e-5)
