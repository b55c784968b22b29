"""Levers for training past the fourth epoch (issue 40, item 2): altered copies of the histories
(``augment_views`` / ``augment_drop``) and NEFTune's noise on the input rows, new SID rows included
(``neftune_noise_alpha``), as settings with clear errors, their rows, the noise reaching the new rows in
training only, and a run that resumes on the same data."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from helpers.toy_catalogue import toy_catalogue, toy_index

from peft_grounded.checks import SettingsError
from peft_grounded.prompts import PromptFormat
from peft_grounded.training.sft import (
    RecommendationConfig,
    RecommendationTrainer,
    train_recommender,
    training_dataset,
)
from peft_grounded.training.sft.data import Augmentation

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


@pytest.mark.parametrize(
    "bad, named",
    [
        ({"augment_views": -1}, "augment_views"),
        ({"augment_views": 1.5}, "augment_views"),
        ({"augment_drop": 1.0}, "augment_drop"),
        ({"augment_drop": -0.1}, "augment_drop"),
        ({"neftune_noise_alpha": -1.0}, "neftune_noise_alpha must be a finite number > 0 or None"),
        ({"neftune_noise_alpha": 0.0}, "neftune_noise_alpha"),
    ],
)
def test_a_bad_setting_is_named(bad, named, tmp_path):
    with pytest.raises(SettingsError, match=named):
        _config(tmp_path, **bad)


def test_views_drop_items_in_order_and_keep_enough():
    histories = [tuple(f"i{k}" for k in range(10)), ("a", "b"), ("z",)]
    views = Augmentation(copies=3, drop=0.5, seed=1).views(histories, min_items=2)
    assert len(views) == 3 * len(histories)
    assert views == Augmentation(copies=3, drop=0.5, seed=1).views(histories, min_items=2)  # seeded
    assert views != Augmentation(copies=3, drop=0.5, seed=2).views(histories, min_items=2)
    for k, view in enumerate(views):
        source = histories[k % len(histories)]
        assert len(view) >= min(2, len(source))
        positions = [source.index(i) for i in view]
        assert positions == sorted(set(positions))  # a subsequence, order kept
    long_views = [v for k, v in enumerate(views) if k % 3 == 0]
    assert any(len(v) < 10 for v in long_views)  # items were dropped
    assert Augmentation(copies=2, drop=0.0).views(histories, min_items=2) == histories * 2


def test_the_altered_copies_are_rows_with_their_own_targets(toy, tokenizer):
    catalogue, index = toy
    tokenizer.add_tokens(index.token_strings)
    split = catalogue.leave_one_out()
    plain = training_dataset(split, index, catalogue, tokenizer, SEQ)
    augmented = training_dataset(
        split, index, catalogue, tokenizer, SEQ, augment=Augmentation(2, 0.4, seed=0)
    )
    assert len(augmented) == 3 * len(plain)
    assert augmented[: len(plain)]["input_ids"] == plain["input_ids"]  # the originals first, unchanged
    sid_vocab = set(tokenizer.convert_tokens_to_ids(index.token_strings))
    for row in augmented.select(range(len(plain), len(augmented))):
        sid_positions = [p for p, t in enumerate(row["input_ids"]) if t in sid_vocab]
        targets = [p for p, m in enumerate(row["completion_mask"]) if m]
        # every item but the first is a target: the mask covers all SID tokens after the first item's
        assert targets == sid_positions[index.n_levels :]
    assert any(
        len(a) < len(b)
        for a, b in zip(augmented[len(plain) :]["input_ids"], list(plain["input_ids"]) * 2, strict=True)
    )
    prompt = PromptFormat(objective="prompt", max_history=3)
    rows = training_dataset(split, index, catalogue, tokenizer, prompt, augment=Augmentation(1, 0.5, seed=0))
    base_rows = training_dataset(split, index, catalogue, tokenizer, prompt)
    assert len(rows) == 2 * len(base_rows) and rows["completion"][len(base_rows) :] == base_rows["completion"]


def test_neftune_noise_reaches_the_new_rows_in_training_only(toy, tokenizer, tmp_path):
    from conftest import build_tiny_model
    from peft import get_peft_model

    import peft_grounded
    from peft_grounded import GroundedTokenConfig

    catalogue, index = toy
    base = build_tiny_model("llama", True)
    tokens, centroids = index.adapter_init()
    ids = peft_grounded.add_tokens(tokenizer, base, tokens)
    config = GroundedTokenConfig(
        token_indices=ids, init="centroid", init_vectors=centroids, task_type="CAUSAL_LM"
    )
    model = get_peft_model(base, config)
    peft_grounded.add_lora(model, r=2, target_modules="all-linear")
    data = training_dataset(catalogue.leave_one_out(), index, catalogue, tokenizer, SEQ)
    trainer = RecommendationTrainer(
        model,
        _config(tmp_path, max_steps=1, neftune_noise_alpha=5.0),
        train_dataset=data,
        processing_class=tokenizer,
    )
    seen = {}

    class Probe:  # reads the embedding output with the hook the trainer installs for training
        def __getattr__(self, name):
            return lambda *a, **k: None

        def on_step_begin(self, args, state, control, model=None, **kw):
            embed = trainer.model.get_input_embeddings()
            batch = torch.tensor([ids[:4]])
            embed.train()
            seen["train"] = (embed(batch), embed(batch))
            embed.eval()
            seen["eval"] = (embed(batch), embed(batch))
            embed.train()

    trainer.add_callback(Probe())
    trainer.train()
    a, b = seen["train"]
    assert not torch.equal(a, b)  # fresh noise on the SID rows at each forward
    assert (a - b).abs().max() <= 2 * 5.0 / (4 * a.shape[-1]) ** 0.5 + 1e-6  # NEFTune's bound
    assert torch.equal(*seen["eval"])  # none outside training


def test_an_augmented_run_resumes_on_the_same_rows(toy, model_dir, tmp_path):
    catalogue, index = toy
    args = dict(max_steps=4, save_steps=2, learning_rate=0.1, warmup_ratio=0.0, lr_scheduler_type="constant")
    args |= dict(optim="sgd", augment_views=2, augment_drop=0.3, neftune_noise_alpha=1.0)
    out = tmp_path / "run"
    torch.manual_seed(0)
    train_recommender(catalogue, index, _config(out, **args), model_path=model_dir, fmt=SEQ, lora=dict(r=2))
    whole = [e["loss"] for e in json.loads((out / "log_history.json").read_text()) if "loss" in e]
    shutil.rmtree(out / "checkpoint-4")
    shutil.rmtree(out / "adapter")  # as if killed after the checkpoint at step 2
    train_recommender(
        catalogue, index, _config(out, **args), model_path=model_dir, fmt=SEQ, lora=dict(r=2), resume=True
    )
    resumed = [e["loss"] for e in json.loads((out / "log_history.json").read_text()) if "loss" in e]
    assert len(resumed) == len(whole) == 4
    assert resumed == pytest.approx(whole, rel=1e-5)  # the same rows, and the noise from the saved RNG
    assert (out / "adapter" / "adapter_model.safetensors").is_file()
    # another augmentation is other data: the checkpoint is refused rather than mixed
    with pytest.raises(ValueError) as refused:
        train_recommender(
            catalogue,
            index,
            _config(out, **(args | {"augment_views": 1})),
            model_path=model_dir,
            fmt=SEQ,
            lora=dict(r=2),
            resume=True,
        )
    assert "differing fields: dataset" in str(refused.value)


def _grounded_model(index, tokenizer):
    from conftest import build_tiny_model
    from peft import get_peft_model

    import peft_grounded
    from peft_grounded import GroundedTokenConfig

    base = build_tiny_model("qwen3", False)
    tokens, centroids = index.adapter_init()
    ids = peft_grounded.add_tokens(tokenizer, base, tokens)
    config = GroundedTokenConfig(
        token_indices=ids, init="centroid", init_vectors=centroids, task_type="CAUSAL_LM"
    )
    model = get_peft_model(base, config)
    peft_grounded.add_lora(model, r=2, target_modules="all-linear")
    return model


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_the_sid_softmax_temperature_divides_the_sid_logits_of_the_loss(
    toy, tokenizer, tmp_path, temperature
):
    """Issue 40, item 4 (LETTER's ranking-guided loss): the loss is the mean cross-entropy of
    ``softmax(SID logits / T)``, computed here from the model's full logits; T = 1 is the plain loss; the
    gradients still reach exactly the rows and the LoRA."""
    catalogue, index = toy
    model = _grounded_model(index, tokenizer)
    data = training_dataset(catalogue.leave_one_out(), index, catalogue, tokenizer, SEQ)
    losses = {}
    for t in (1.0, temperature):
        trainer = RecommendationTrainer(
            model,
            _config(tmp_path / str(t), max_steps=1, sid_softmax_temperature=t),
            train_dataset=data,
            processing_class=tokenizer,
        )
        batch = next(iter(trainer.get_train_dataloader()))
        model.train()
        model.zero_grad()
        losses[t] = trainer.compute_loss(model, batch)
        losses[t].backward()
        grads = {n for n, p in model.named_parameters() if p.grad is not None}
        assert grads == {n for n, p in model.named_parameters() if p.requires_grad}
    with torch.no_grad():
        model.eval()
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids") if k in batch}
        logits = model(
            **inputs
        ).logits  # padded rows, or one padding-free row (the trainer's choice on a CPU)
        model.train()
    labels = batch["labels"][:, 1:]
    mask = labels != -100
    sid_ids = model.base_model.grounded_token_ids()
    columns = torch.searchsorted(sid_ids, labels[mask])
    for t, loss in losses.items():
        log_p = (logits[:, :-1][mask][:, sid_ids].float() / t).log_softmax(-1)
        expected = -log_p.gather(1, columns[:, None]).mean()
        torch.testing.assert_close(loss.detach(), expected, rtol=1e-5, atol=1e-6)
    assert not torch.isclose(losses[1.0], losses[temperature])


def test_a_temperature_without_the_sid_softmax_is_refused(tmp_path):
    with pytest.raises(SettingsError, match="sid_softmax_temperature"):
        _config(tmp_path, sid_softmax_temperature=0.5, sid_softmax=False)
    with pytest.raises(SettingsError, match="sid_softmax_temperature"):
        _config(tmp_path, sid_softmax_temperature=0.0)


def test_keep_best_picks_on_every_validation_user_not_the_curves_sample(model_dir, tmp_path):
    """Issue 40: keep_best's Recall points decode all validation users (or keep_best_users), while the NLL
    curve keeps its small sample; the budget records the choice."""
    from dataclasses import replace

    from peft_grounded.pipeline.budget import Budget
    from peft_grounded.pipeline.demo import PRESETS, run_demo

    catalogue = toy_catalogue()
    everyone = len(catalogue.leave_one_out().users)
    smoke = PRESETS["smoke"]
    budget = replace(smoke.budget, keep_best=True, eval_every=1, curve_every=1, curve_users=2)
    spec = replace(smoke, budget=budget, strategies=("mean",), peers=(), name="keep-best")
    run_demo(spec, tmp_path / "demo", model=model_dir, catalogue=catalogue, diagnostics=False)
    log = json.loads((tmp_path / "demo/strategies/mean-seed0/sft/log_history.json").read_text())
    recall_users = {e["eval_users"] for e in log if "eval_users" in e}
    nll_users = {e["valid_users"] for e in log if "valid_users" in e}
    assert recall_users == {everyone} and nll_users == {2} and everyone > 2
    assert any("restored_best_step" in e for e in log)
    assert Budget(keep_best=True, eval_every=1).record()["keep_best_users"] is None  # all of them
    assert Budget(keep_best=True, eval_every=1, keep_best_users=50).record()["keep_best_users"] == 50
    assert Budget().record()["keep_best_users"] is None
    with pytest.raises(SettingsError, match="keep_best_users"):
        Budget(keep_best=True, eval_every=1, keep_best_users=0)
