"""The training attention (training.steps.training_attention): per sequence on padding-free rows, the same loss
and gradients as SDPA under the row-wide block-diagonal mask; in float32 under a CPU's bf16 autocast, the same
loss as bf16 attention within bf16's rounding; gradients on exactly the trainable weights, the model's own
implementation back after the block, models on other implementations left alone, and the trainer using it on
a CPU (float32 attention for bf16 only)."""

from __future__ import annotations

import pytest
import torch
from conftest import build_tiny_model
from helpers.lora_models import lora_model
from transformers import TrainerCallback

from peft_grounded.training.steps import attention_name, packed_lengths, training_attention


def _wrapped(arch: str, tied: bool):
    model = build_tiny_model(arch, tied)
    model.set_attn_implementation("sdpa")
    return lora_model(model, ["q_proj", "v_proj"])


def _loss_and_grads(model, batch):
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(**batch, labels=batch["input_ids"], use_cache=False).loss
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("arch, tied", [("llama", True), ("qwen3", False)])
def test_float32_attention_keeps_the_loss_and_the_gradients(arch, tied):
    model = _wrapped(arch, tied)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 500, (3, 24), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 18:] = 0
    batch = {"input_ids": ids, "attention_mask": mask}
    plain, plain_grads = _loss_and_grads(model, batch)
    base = model.get_base_model()
    with training_attention(model, float32=True) as name:
        assert name == attention_name(True, True) == base.config._attn_implementation
        fast, fast_grads = _loss_and_grads(model, batch)
    assert base.config._attn_implementation == "sdpa"  # restored
    assert fast == pytest.approx(plain, rel=2e-2)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert set(fast_grads) == set(plain_grads) == trainable
    for name, grad in plain_grads.items():
        assert torch.nn.functional.cosine_similarity(fast_grads[name].flatten(), grad.flatten(), dim=0) > 0.98


def test_other_implementations_and_a_block_with_nothing_on_are_left_alone():
    model = _wrapped("llama", True)
    with training_attention(model, float32=False, per_sequence=False) as name:
        assert name is None and model.get_base_model().config._attn_implementation == "sdpa"
    model.get_base_model().set_attn_implementation("eager")
    with training_attention(model, float32=True) as name:
        assert name is None and model.get_base_model().config._attn_implementation == "eager"


class _Seen(TrainerCallback):
    def __init__(self) -> None:
        self.implementations: list[str] = []

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.implementations.append(model.get_base_model().config._attn_implementation)


@pytest.mark.parametrize("bf16", [True, False])
def test_the_trainer_uses_it_on_a_cpu_in_float32_for_bf16_only(tokenizer, tmp_path, bf16):
    from helpers.toy_catalogue import toy_catalogue, toy_index
    from peft import get_peft_model

    import peft_grounded
    from peft_grounded import GroundedTokenConfig
    from peft_grounded.prompts import PromptFormat
    from peft_grounded.training.sft import RecommendationConfig, RecommendationTrainer, training_dataset

    catalogue = toy_catalogue()
    index = toy_index(catalogue)
    base = build_tiny_model("llama", True)
    base.set_attn_implementation("sdpa")
    ids = peft_grounded.add_tokens(tokenizer, base, index.token_strings)
    model = get_peft_model(base, GroundedTokenConfig(token_indices=ids, task_type="CAUSAL_LM"))
    fmt = PromptFormat(objective="sequence", max_history=3)
    data = training_dataset(catalogue.leave_one_out(), index, catalogue, tokenizer, fmt)
    seen = _Seen()
    args = RecommendationConfig(
        output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, max_steps=2, use_cpu=True,
        report_to="none", disable_tqdm=True, save_steps=1000, bf16=bf16, max_length=64,
    )  # fmt: skip
    trainer = RecommendationTrainer(
        model, args, train_dataset=data, processing_class=tokenizer, callbacks=[seen]
    )
    trainer.train()
    assert seen.implementations == [attention_name(bf16, True)] * 2
    assert base.config._attn_implementation == "sdpa"  # restored after training


_ROWS = [
    {"input_ids": list(range(5, 25)), "completion_mask": [1] * 20},
    {"input_ids": [11, 12, 13], "completion_mask": [0, 1, 1]},
    {"input_ids": [7], "completion_mask": [1]},
    {"input_ids": list(range(30, 40)), "completion_mask": [1] * 10},
]


def test_packed_lengths_reads_a_padding_free_row_only():
    from benchmarks.bench_step_limit import collate

    free = collate(_ROWS, 0, padding_free=True)
    assert packed_lengths(free["position_ids"], 34) == [20, 3, 1, 10]
    assert packed_lengths(free["position_ids"], 33) is None  # a cache: queries and keys differ
    assert packed_lengths(torch.arange(12).unsqueeze(0), 12) is None  # one sequence
    assert packed_lengths(torch.arange(12).repeat(2, 1), 12) is None  # a padded batch
    assert packed_lengths(None, 12) is None


@pytest.mark.parametrize("arch, tied", [("llama", True), ("llama", False), ("qwen3", True), ("qwen3", False)])
def test_per_sequence_attention_is_the_masked_row_loss_and_gradients(arch, tied):
    """Each packed sequence attended on its own gives the loss and every gradient of SDPA over the whole row
    under its block-diagonal mask (float32), and of the rows padded; nothing leaks between sequences."""
    from benchmarks.bench_step_limit import collate

    model = _wrapped(arch, tied)
    free = collate(_ROWS, 0, padding_free=True)
    padded = collate(_ROWS, 0, padding_free=False)

    def run(batch, per_sequence):
        model.zero_grad()
        with training_attention(model, per_sequence=per_sequence):
            loss = model(**batch, use_cache=False).loss
            loss.backward()
        return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    masked, masked_grads = run(free, per_sequence=False)
    split, split_grads = run(free, per_sequence=True)
    rows, _ = run(padded, per_sequence=True)
    assert split == pytest.approx(masked, abs=1e-6) and split == pytest.approx(rows, abs=1e-5)
    assert (
        set(split_grads) == set(masked_grads) == {n for n, p in model.named_parameters() if p.requires_grad}
    )
    for name, grad in masked_grads.items():
        torch.testing.assert_close(split_grads[name], grad, rtol=1e-4, atol=1e-6)
    # a sequence's logits do not depend on its neighbours in the row
    model.eval()
    with torch.no_grad(), training_attention(model):
        alone = model(**collate(_ROWS[3:], 0, padding_free=True)).logits[0]
        packed = model(**free).logits[0, 24:]
    torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("padding_free", [False, True])
def test_in_float32_a_padded_batch_is_sdpa_itself_and_a_packed_row_its_masked_loss(padding_free):
    """The same loss to the bit for padded rows, and within float32's rounding for a padding-free row (the mask
    builder is registered under the function's name: without it, padded rows would attend to padding)."""
    from benchmarks.bench_step_limit import collate

    model = build_tiny_model("llama", True).train()
    model.set_attn_implementation("sdpa")
    batch = collate(_ROWS, 0, padding_free)
    plain = model(**batch, use_cache=False).loss.item()
    with training_attention(model):
        loss = model(**batch, use_cache=False).loss.item()
    assert loss == plain if not padding_free else loss == pytest.approx(plain, abs=1e-6)
