"""Padding-free batches (TRL's ``padding_free``: a batch's rows concatenated into one, positions restarting at
each row) on CPU attention: the loss and the gradients of the padded batch, reaching exactly the rows and the
LoRA, on tied Llama and untied Qwen3; a run that trains, logs the padded run's losses and resumes; rows over
max_length refused, since nothing is cut."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from helpers.toy_catalogue import toy_catalogue, toy_index

from peft_grounded.prompts import PromptFormat
from peft_grounded.training.sft import (
    RecommendationConfig,
    RecommendationTrainer,
    train_recommender,
    training_dataset,
)

SEQ = PromptFormat(objective="sequence", max_history=3)


@pytest.fixture(scope="module")
def toy():
    catalogue = toy_catalogue()
    return catalogue, toy_index(catalogue)


def _config(out, **kw) -> RecommendationConfig:
    base = dict(
        output_dir=str(out),
        per_device_train_batch_size=4,
        logging_steps=1,
        save_steps=1000,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        seed=0,
        max_length=64,
    )
    return RecommendationConfig(**(base | kw))


@pytest.mark.parametrize("arch, tied", [("llama", True), ("qwen3", False)])
def test_the_padding_free_batch_has_the_padded_loss_and_gradients(toy, tokenizer, arch, tied, tmp_path):
    from conftest import build_tiny_model
    from peft import get_peft_model

    import peft_grounded
    from peft_grounded import GroundedTokenConfig

    catalogue, index = toy
    base = build_tiny_model(arch, tied)
    tokens, centroids = index.adapter_init()
    ids = peft_grounded.add_tokens(tokenizer, base, tokens)
    config = GroundedTokenConfig(
        token_indices=ids, init="centroid", init_vectors=centroids, task_type="CAUSAL_LM"
    )
    model = get_peft_model(base, config)
    peft_grounded.add_lora(model, r=2, target_modules="all-linear")
    data = training_dataset(catalogue.leave_one_out(), index, catalogue, tokenizer, SEQ)
    results = {}
    for free in (False, True):
        trainer = RecommendationTrainer(
            model,
            _config(tmp_path / f"f{free}", max_steps=1, padding_free=free),
            train_dataset=data,
            processing_class=tokenizer,
        )
        batch = next(iter(trainer.get_train_dataloader()))
        assert ("attention_mask" in batch) != free and ("position_ids" in batch) == free
        model.train()
        model.zero_grad()
        loss = trainer.compute_loss(model, batch)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results[free] = (loss.item(), grads, int((batch["labels"] != -100).sum()))
    (padded, padded_grads, padded_targets), (free, free_grads, free_targets) = results[False], results[True]
    assert free_targets == padded_targets
    assert free == pytest.approx(padded, rel=1e-5)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert set(free_grads) == set(padded_grads) == trainable  # exactly the rows and the LoRA
    assert any("lora_" in n for n in trainable) and any("grounded" in n for n in trainable)
    for name, grad in padded_grads.items():
        torch.testing.assert_close(free_grads[name], grad, rtol=1e-4, atol=1e-6)


def test_a_padding_free_run_logs_the_padded_losses_and_resumes(toy, model_dir, tmp_path):
    catalogue, index = toy
    # SGD: Adam turns the rounding noise of near-zero gradient entries (the two batches sum in another order)
    # into full-size steps, so only a step proportional to the gradient can show the runs equal
    args = dict(max_steps=4, save_steps=2, learning_rate=0.1, warmup_ratio=0.0, lr_scheduler_type="constant")
    args |= dict(optim="sgd")
    logs = {}
    for free in (False, True):
        out = tmp_path / f"run-{free}"
        train_recommender(
            catalogue,
            index,
            _config(out, padding_free=free, **args),
            model_path=model_dir,
            fmt=SEQ,
            lora=dict(r=2),
        )
        logs[free] = [e["loss"] for e in json.loads((out / "log_history.json").read_text()) if "loss" in e]
    assert logs[True] == pytest.approx(logs[False], rel=1e-4)  # float rounding differs, nothing else
    out = tmp_path / "run-True"
    shutil.rmtree(out / "checkpoint-4")
    shutil.rmtree(out / "adapter")  # as if killed after the checkpoint at step 2
    train_recommender(
        catalogue,
        index,
        _config(out, padding_free=True, **args),
        model_path=model_dir,
        fmt=SEQ,
        lora=dict(r=2),
        resume=True,
    )
    resumed = [e["loss"] for e in json.loads((out / "log_history.json").read_text()) if "loss" in e]
    assert resumed == pytest.approx(logs[True], rel=1e-4)
    assert (out / "adapter" / "adapter_model.safetensors").is_file()


def test_rows_over_max_length_are_refused_when_nothing_is_cut(toy, model_dir, tmp_path):
    catalogue, index = toy
    with pytest.raises(ValueError, match="longer than max_length=8 tokens, and padding-free batches"):
        train_recommender(
            catalogue,
            index,
            _config(tmp_path / "cut", max_steps=1, max_length=8, padding_free=True),
            model_path=model_dir,
            fmt=SEQ,
            lora=dict(r=2),
        )


def test_padding_free_by_default_where_padding_would_dominate(toy, tokenizer):
    """``padding_free=None`` decides from the rows' lengths: on where padded batches would hold at least
    padding_free_ratio(device) times their tokens (lower on a CPU, where the trainer attends per sequence), off
    for rows of similar length and for rows not yet tokenised."""
    from datasets import Dataset

    from peft_grounded.training.stage_config import padding_free_ratio, wants_padding_free

    even = Dataset.from_dict({"input_ids": [[1] * 40 for _ in range(64)]})
    uneven = Dataset.from_dict({"input_ids": [[1] * (100 if i % 8 == 0 else 10) for i in range(64)]})
    # ML-100K's shape: rows of 90-101 tokens, padded batches ~1.08x their real tokens
    similar = Dataset.from_dict({"input_ids": [[1] * (90 + i % 12) for i in range(64)]})
    for device in ("cpu", "cuda"):
        assert not wants_padding_free(even, 8, device_type=device)
        assert wants_padding_free(uneven, 8, device_type=device)
        assert not wants_padding_free(uneven, 1, device_type=device)  # one row a batch: nothing to pad
    assert wants_padding_free(similar, 8, device_type="cpu") and not wants_padding_free(
        similar, 8, device_type="cuda"
    )
    assert not wants_padding_free(Dataset.from_dict({"prompt": ["a"] * 8, "completion": ["b"] * 8}), 8)
    assert 1 < padding_free_ratio("cpu") < padding_free_ratio("cuda")
    catalogue, index = toy
    tokenizer.add_tokens(index.token_strings)
    data = training_dataset(catalogue.leave_one_out(), index, catalogue, tokenizer, SEQ)
    assert not wants_padding_free(data, 4, device_type="cuda")  # the toy rows are of about one length
