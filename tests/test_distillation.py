"""Distillation from the fast peer (issue 40, item 3): SASRec's next-item distribution summed onto the SID trie
(hand-computed on a six-item index), its columns aligned with the rows of both objectives and augmentation, the
loss ``(1 - w) * CE + w * softCE`` against the model's own logits (bit-identical off), gradients on exactly the
rows and the LoRA, padded and padding-free batches alike, clear refusals, and a resume on the cached targets."""

from __future__ import annotations

import json
import logging
import shutil

import numpy as np
import pytest
import torch
from helpers.toy_catalogue import toy_catalogue, toy_index
from safetensors.torch import load_file

from peft_grounded.checks import SettingsError
from peft_grounded.prompts import PromptFormat
from peft_grounded.sids.index import SIDIndex
from peft_grounded.sids.sasrec import SASRecConfig, SASRecRecommender, fit_sasrec
from peft_grounded.training.sft import (
    RecommendationConfig,
    RecommendationTrainer,
    train_recommender,
    training_dataset,
)
from peft_grounded.training.sft import distillation as dist
from peft_grounded.training.sft.data import Augmentation

SEQ = PromptFormat(objective="sequence", max_history=3)
TOP_K = 4


@pytest.fixture(scope="module")
def toy():
    catalogue = toy_catalogue()
    return catalogue, toy_index(catalogue)


@pytest.fixture(scope="module")
def teacher(toy):
    catalogue, index = toy
    config = SASRecConfig(hidden_size=16, max_epochs=3, seed=0)
    return fit_sasrec(catalogue.leave_one_out(), index.item_ids, config)


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
        distill_top_k=TOP_K,
    )
    return RecommendationConfig(**(base | kw))


def _distilled(toy, teacher, tokenizer, fmt=SEQ, augment=None):
    catalogue, index = toy
    split = catalogue.leave_one_out()
    rows = dist.training_rows(split, fmt, augment)
    targets = dist.teacher_targets(teacher, rows, index, tokenizer, TOP_K)
    data = training_dataset(split, index, catalogue, tokenizer, fmt, augment=augment)
    return dist.add_teacher_columns(data, targets, rows, index, tokenizer)


def _model(toy, tokenizer, arch="llama", tied=True):
    from conftest import build_tiny_model
    from peft import get_peft_model

    import peft_grounded
    from peft_grounded import GroundedTokenConfig

    _, index = toy
    base = build_tiny_model(arch, tied)
    tokens, centroids = index.adapter_init()
    ids = peft_grounded.add_tokens(tokenizer, base, tokens)
    config = GroundedTokenConfig(
        token_indices=ids, init="centroid", init_vectors=centroids, task_type="CAUSAL_LM"
    )
    model = get_peft_model(base, config)
    peft_grounded.add_lora(model, r=2, target_modules="all-linear")
    return model


def _batch(model, config, data, tokenizer):
    trainer = RecommendationTrainer(model, config, train_dataset=data, processing_class=tokenizer)
    return trainer, next(iter(trainer.get_train_dataloader()))


# ------------------------------------------------------------------------------------------------ the trie


def _six_items() -> SIDIndex:
    codes = np.array([[0, 0, 0], [0, 0, 1], [0, 1, 0], [1, 0, 0], [1, 1, 0], [2, 0, 0]])
    return SIDIndex(
        item_ids=[f"i{k}" for k in range(6)],
        codes=codes,
        codes_per_level=(3, 2, 2),
        codebooks=[np.zeros((3, 2)), np.zeros((2, 2)), np.zeros((2, 2))],
        centroids={},
    )


def test_the_teacher_is_summed_onto_the_trie_level_by_level():
    index = _six_items()
    p = torch.tensor([0.05, 0.20, 0.30, 0.15, 0.05, 0.25], dtype=torch.float64)
    probs = torch.stack([p, p, torch.tensor([0.5, 0.5, 0, 0, 0, 0], dtype=torch.float64)])
    targets = torch.tensor([1, 4, 5])  # SIDs (0,0,1), (1,1,0), (2,0,0)
    codes, q = dist.trie_distributions(probs, targets, torch.as_tensor(index.codes), index.codes_per_level, 2)
    # item 1: level 1 q = (.55, .20, .25), top 2 renormalised; level 2 within <0>: (.25, .30) / .55; level 3
    # within <0><0>: (.05, .20) / .25
    assert codes[0].tolist() == [[0, 2], [1, 0], [1, 0]]
    expected = [[0.55 / 0.8, 0.25 / 0.8], [6 / 11, 5 / 11], [0.8, 0.2]]
    torch.testing.assert_close(q[0], torch.tensor(expected, dtype=torch.float64))
    # item 4: level 2 within <1>: (.15, .05) / .2; level 3 within <1><1>: item 4 alone
    assert codes[1, 1:].tolist() == [[0, 1], [0, 1]]
    torch.testing.assert_close(q[1, 1:], torch.tensor([[0.75, 0.25], [1.0, 0.0]], dtype=torch.float64))
    # a prefix the teacher gives no mass takes the target's own code (item 5 under p = (.5, .5, 0, ...))
    assert codes[2, 0, 0] == 0 and codes[2, 1:, 0].tolist() == [0, 0]
    torch.testing.assert_close(q[2, :, 0], torch.ones(3, dtype=torch.float64))
    # top_k beyond a level's codes pads with probability 0; top_k 1 keeps the mode with probability 1
    wide_codes, wide = dist.trie_distributions(
        probs[:1], targets[:1], torch.as_tensor(index.codes), index.codes_per_level, 3
    )
    torch.testing.assert_close(wide[0, 0], torch.tensor([0.55, 0.25, 0.20], dtype=torch.float64))
    assert wide[0, 1, 2] == 0 and wide_codes[0, 1, 2] == wide_codes[0, 1, 0]
    _, narrow = dist.trie_distributions(
        probs[:1], targets[:1], torch.as_tensor(index.codes), index.codes_per_level, 1
    )
    assert narrow[0, :, 0].tolist() == [1.0, 1.0, 1.0]


def test_each_level_s_codes_become_that_level_s_token_ids(tokenizer):
    index = _six_items()
    tokenizer.add_tokens(index.token_strings)
    per_level = dist.level_token_ids(index, tokenizer)
    for level, ids in enumerate(per_level):
        strings = index.token_strings[index.token_offset(level) : index.token_offset(level + 1)]
        assert ids.tolist() == tokenizer.convert_tokens_to_ids(strings)
    with pytest.raises(ValueError, match="not in the tokenizer"):
        dist.level_token_ids(toy_index(toy_catalogue()), tokenizer)


# ------------------------------------------------------------------------------------------------ the columns


@pytest.mark.parametrize(
    "fmt, augment",
    [
        (SEQ, None),
        (SEQ, Augmentation(1, 0.4, seed=0)),
        (PromptFormat(objective="prompt", max_history=3), Augmentation(1, 0.5, seed=0)),
    ],
)
def test_every_labelled_sid_token_gets_the_teacher_s_targets(toy, teacher, tokenizer, fmt, augment):
    catalogue, index = toy
    tokenizer.add_tokens(index.token_strings)
    split = catalogue.leave_one_out()
    rows = dist.training_rows(split, fmt, augment)
    data = _distilled(toy, teacher, tokenizer, fmt, augment)
    assert len(rows) == len(data)
    per_row = [len(ids) for ids in data["teacher_ids"]]
    assert per_row == [row.targets * index.n_levels for row in rows]
    if fmt.objective == "sequence":
        assert per_row == [sum(mask) for mask in data["completion_mask"]]
    # every original transition is scored once, after the user's whole history before it
    originals = rows[: len(list(split.train_examples()))] if fmt.objective == "prompt" else rows
    seen = [(row.items[:t], row.items[t]) for row in originals for t in range(row.first, len(row.items))]
    if augment is None:
        expected = [(u.history[:t], u.history[t]) for u in split.users for t in range(1, len(u.history))]
        assert seen == expected
    probs = torch.tensor([p for row in data["teacher_probs"] for p in row])
    assert probs.shape[1] == TOP_K and torch.allclose(probs.sum(1), torch.ones(len(probs)))
    sid_ids = set(tokenizer.convert_tokens_to_ids(index.token_strings))
    assert {t for row in data["teacher_ids"] for ids in row for t in ids} <= sid_ids
    # rows in another order than the teacher scored are refused, not mixed up
    with pytest.raises(ValueError, match="row"):
        targets = dist.teacher_targets(teacher, rows, index, tokenizer, TOP_K)
        shuffled = training_dataset(split, index, catalogue, tokenizer, fmt, augment=augment).shuffle(seed=1)
        dist.add_teacher_columns(shuffled, targets, rows, index, tokenizer)


# ------------------------------------------------------------------------------------------------ the loss


def test_weight_zero_is_the_plain_loss_bit_for_bit(toy, teacher, tokenizer, model_dir, tmp_path):
    model = _model(toy, tokenizer)
    catalogue, index = toy
    plain = training_dataset(catalogue.leave_one_out(), index, catalogue, tokenizer, SEQ)
    data = _distilled(toy, teacher, tokenizer)
    model.eval()
    losses = []
    for name, rows in (("plain", plain), ("teacher", data)):
        trainer, batch = _batch(model, _config(tmp_path / name, max_steps=1), rows, tokenizer)
        assert "teacher_ids" not in batch  # off: the columns never reach the batch
        losses.append(trainer.compute_loss(model, batch))
    assert torch.equal(*losses)
    off = tmp_path / "off"
    train_recommender(
        catalogue, index, _config(off, max_steps=1), model_path=model_dir, fmt=SEQ, lora=dict(r=2)
    )
    assert (off / "adapter").is_dir() and not (off / "teacher").exists()  # no teacher is fitted
    assert json.loads((off / "run.json").read_text())["distillation"] is None


def _reference(model, batch, w: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss, mean softCE)`` from the model's full logits, the SID-only softmax computed here."""
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids") if k in batch}
    logits = model(**inputs).logits  # padded rows, or one padding-free row (the trainer's choice on a CPU)
    labels = batch["labels"][:, 1:]
    mask = labels != -100
    sid_ids = model.base_model.grounded_token_ids()
    log_p = logits[:, :-1][mask][:, sid_ids].float().log_softmax(-1)
    hard = -log_p.gather(1, torch.searchsorted(sid_ids, labels[mask])[:, None]).squeeze(1)
    teacher = log_p.gather(1, torch.searchsorted(sid_ids, batch["teacher_ids"]))
    soft = -(batch["teacher_probs"] * teacher).sum(-1)
    return ((1 - w) * hard + w * soft).mean(), soft.mean()


def test_the_loss_mixes_the_hard_and_the_soft_cross_entropy(toy, teacher, tokenizer, tmp_path):
    model = _model(toy, tokenizer)
    data = _distilled(toy, teacher, tokenizer)
    w = 0.3
    trainer, batch = _batch(model, _config(tmp_path, max_steps=1, distill_weight=w), data, tokenizer)
    assert batch["teacher_ids"].shape == (int((batch["labels"] != -100).sum()), TOP_K)
    model.eval()
    loss = trainer.compute_loss(model, batch)
    with torch.no_grad():
        expected, soft = _reference(model, batch, w)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    assert trainer._metrics["eval"]["distill_loss"][-1] == pytest.approx(soft.item(), rel=1e-5)
    assert soft > 0 and not torch.isclose(loss, _reference(model, batch, 0.0)[0].detach())


def test_the_soft_term_trains_exactly_the_rows_and_the_lora(toy, teacher, tokenizer, tmp_path):
    model = _model(toy, tokenizer)
    data = _distilled(toy, teacher, tokenizer)
    trainer, batch = _batch(model, _config(tmp_path, max_steps=1, distill_weight=1.0), data, tokenizer)
    model.train()
    model.zero_grad()
    loss = trainer.compute_loss(model, batch)
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert set(grads) == trainable  # weight 1: the soft term alone reaches them, nothing else has a gradient
    assert any("lora_" in n for n in trainable) and any("grounded" in n for n in trainable)
    assert all(grads[n].abs().sum() > 0 for n in trainable if "grounded" in n or "lora_B" in n)
    with torch.no_grad():
        model.eval()
        assert loss.item() == pytest.approx(_reference(model, batch, 1.0)[1].item(), rel=1e-5)


@pytest.mark.parametrize("arch, tied", [("llama", True), ("qwen3", False)])
def test_padded_and_padding_free_batches_distil_alike(toy, teacher, tokenizer, tmp_path, arch, tied):
    model = _model(toy, tokenizer, arch, tied)
    data = _distilled(toy, teacher, tokenizer)
    results = {}
    for free in (False, True):
        config = _config(tmp_path / f"f{free}", max_steps=1, padding_free=free, distill_weight=0.5)
        trainer, batch = _batch(model, config, data, tokenizer)
        assert ("position_ids" in batch) == free
        model.train()
        model.zero_grad()
        loss = trainer.compute_loss(model, batch)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results[free] = (loss.item(), trainer._metrics["train"]["distill_loss"][-1], grads, batch)
    (loss, soft, grads, batch), (free_loss, free_soft, free_grads, free_batch) = results[False], results[True]
    assert torch.equal(batch["teacher_ids"], free_batch["teacher_ids"])
    assert free_soft == pytest.approx(soft, abs=1e-5) and free_loss == pytest.approx(loss, abs=1e-5)
    assert set(free_grads) == set(grads)
    for name, grad in grads.items():
        torch.testing.assert_close(free_grads[name], grad, rtol=1e-4, atol=1e-6)


def test_the_prompt_objective_distils_its_sid_tokens(toy, teacher, tokenizer, tmp_path):
    model = _model(toy, tokenizer)
    fmt = PromptFormat(objective="prompt", max_history=3)
    data = _distilled(toy, teacher, tokenizer, fmt)
    trainer, batch = _batch(model, _config(tmp_path, max_steps=1, distill_weight=0.5), data, tokenizer)
    assert (
        batch["teacher_ids"].shape[0] == 4 * toy[1].n_levels
    )  # one SID a row; other labels keep the full head
    assert int((batch["labels"] != -100).sum()) > batch["teacher_ids"].shape[0]
    assert torch.isfinite(trainer.compute_loss(model, batch))


# ------------------------------------------------------------------------------------------------ the confident share


def test_the_confident_share_keeps_the_teacher_where_it_is_surest():
    codes = torch.arange(4 * 2 * 3).reshape(4, 2, 3)
    probs = torch.full((4, 2, 3), 1 / 3)
    true = torch.tensor([[7, 8], [9, 10], [11, 12], [13, 14]])
    confidence = torch.tensor([0.1, 0.9, 0.5, 0.5], dtype=torch.float64)
    kept_codes, kept_probs = codes.clone(), probs.clone()
    dist.keep_confident(kept_codes, kept_probs, true, confidence, 0.5)  # two of four: 0.9, then the first 0.5
    for t in (1, 2):
        assert torch.equal(kept_codes[t], codes[t]) and torch.equal(kept_probs[t], probs[t])
    for t in (0, 3):  # one-hot on the target's own code at every level
        assert kept_codes[t].tolist() == [[true[t, 0].item()] * 3, [true[t, 1].item()] * 3]
        assert kept_probs[t].tolist() == [[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]
    untouched_codes, untouched_probs = codes.clone(), probs.clone()
    dist.keep_confident(untouched_codes, untouched_probs, true, confidence, 1.0)
    assert torch.equal(untouched_codes, codes) and torch.equal(untouched_probs, probs)


def _shared(toy, teacher, tokenizer, share: float):
    catalogue, index = toy
    tokenizer.add_tokens(index.token_strings)
    split = catalogue.leave_one_out()
    rows = dist.training_rows(split, SEQ)
    return dist.teacher_targets(teacher, rows, index, tokenizer, TOP_K, share), rows


def test_the_teacher_s_confidence_picks_the_distilled_targets(toy, teacher, tokenizer):
    _, index = toy
    whole, rows = _shared(toy, teacher, tokenizer, 1.0)
    half, _ = _shared(toy, teacher, tokenizer, 0.5)
    plain = half.probs[:, :, 0].eq(1).all(1) & half.probs[:, :, 1:].eq(0).all((1, 2))
    n = len(whole.ids)
    assert int((~plain).sum()) >= round(0.5 * n) > 0  # the kept half (a kept one-hot counts once too)
    distilled = torch.equal(half.ids[~plain], whole.ids[~plain]) and torch.equal(
        half.probs[~plain], whole.probs[~plain]
    )
    assert distilled
    # the others: the one-hot target is the item's own SID, as the rows label it
    token_ids = dist.level_token_ids(index, tokenizer)
    items = [row.items[t] for row in rows for t in range(row.first, len(row.items))]
    own = torch.tensor(
        [
            [token_ids[lv][index.codes[index.row_of(i)][lv]].item() for lv in range(index.n_levels)]
            for i in items
        ]
    )
    assert torch.equal(half.ids[plain][:, :, 0].long(), own[plain])
    # the teacher's confidence, recomputed: every kept target is at least as sure as every one-hot target
    teacher_index = {item: k + 1 for k, item in enumerate(teacher.item_ids)}
    prefixes = [
        [teacher_index[i] for i in row.items[:t]] for row in rows for t in range(row.first, len(row.items))
    ]
    sure = torch.softmax(teacher._item_scores(prefixes).double(), -1).max(1).values
    changed = ~(half.probs.eq(whole.probs).all((1, 2)))
    assert changed.any() and sure[changed].max() <= sure[~plain].min() + 1e-12


def test_targets_left_out_of_distillation_train_on_their_own_cross_entropy(toy, teacher, tokenizer, tmp_path):
    model = _model(toy, tokenizer)
    catalogue, index = toy
    split = catalogue.leave_one_out()
    rows = dist.training_rows(split, SEQ)
    none = dist.teacher_targets(teacher, rows, index, tokenizer, TOP_K, 1e-9)  # no target distilled
    data = dist.add_teacher_columns(
        training_dataset(split, index, catalogue, tokenizer, SEQ), none, rows, index, tokenizer
    )
    results = []
    for w in (0.0, 0.7):
        trainer, batch = _batch(
            model, _config(tmp_path / f"w{w}", max_steps=1, distill_weight=w), data, tokenizer
        )
        model.train()
        model.zero_grad()
        loss = trainer.compute_loss(model, batch)
        loss.backward()
        results.append(
            (loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        )
    (plain, plain_grads), (mixed, mixed_grads) = results
    torch.testing.assert_close(mixed, plain, rtol=1e-5, atol=1e-6)
    assert set(mixed_grads) == set(plain_grads) and plain_grads
    for name, grad in plain_grads.items():
        torch.testing.assert_close(mixed_grads[name], grad, rtol=1e-4, atol=1e-6)


def test_the_confident_share_is_part_of_the_cached_targets_key(toy, tokenizer):
    catalogue, index = toy
    tokenizer.add_tokens(index.token_strings)
    split = catalogue.leave_one_out()
    keys = [dist._keys(split, index, tokenizer, SEQ, None, TOP_K, 3, 0, share) for share in (1.0, 0.5)]
    assert keys[0][0] == keys[1][0]  # the same teacher
    assert keys[0][1] != keys[1][1]  # other targets


# ------------------------------------------------------------------------------------------------ settings


@pytest.mark.parametrize(
    "bad, named",
    [
        ({"distill_weight": -0.1}, "distill_weight"),
        ({"distill_weight": 1.5}, "distill_weight"),
        ({"distill_weight": float("nan")}, "distill_weight"),
        ({"distill_top_k": 0}, "distill_top_k"),
        ({"distill_top_k": 2.5}, "distill_top_k"),
        ({"distill_epochs": 0}, "distill_epochs"),
        ({"distill_confident_share": 0.0}, "distill_confident_share"),
        ({"distill_confident_share": 1.5}, "distill_confident_share"),
        ({"distill_confident_share": float("nan")}, "distill_confident_share"),
        ({"distill_epochs": 1.5}, "distill_epochs"),
        ({"distill_weight": 0.5, "sid_softmax": False}, "distill_weight > 0 needs the SID-only softmax"),
        ({"distill_weight": 0.5, "packing": True}, "distill_weight > 0 needs unpacked rows"),
        ({"distill_weight": 0.5, "loss_type": "dft"}, "distill_weight > 0 mixes into the NLL loss"),
    ],
)
def test_a_bad_setting_is_named(bad, named, tmp_path):
    with pytest.raises(SettingsError, match=named):
        _config(tmp_path, **bad)


def test_the_trainer_refuses_distillation_it_cannot_do(toy, teacher, tokenizer, tmp_path):
    model = _model(toy, tokenizer)
    catalogue, index = toy
    plain = training_dataset(catalogue.leave_one_out(), index, catalogue, tokenizer, SEQ)
    with pytest.raises(ValueError, match="no teacher_ids / teacher_probs columns"):
        RecommendationTrainer(model, _config(tmp_path, distill_weight=0.5), train_dataset=plain)
    data = _distilled(toy, teacher, tokenizer)
    smoothed = _config(tmp_path, distill_weight=0.5, label_smoothing_factor=0.1)  # no SID-only softmax then
    with pytest.raises(ValueError, match=r"distill_weight=0\.5 scores the teacher's soft targets"):
        RecommendationTrainer(model, smoothed, train_dataset=data, processing_class=tokenizer)


# ------------------------------------------------------------------------------------------------ a run


def test_a_distilled_run_logs_its_soft_loss_and_resumes_on_the_same_targets(toy, model_dir, tmp_path, caplog):
    catalogue, index = toy
    args = dict(max_steps=4, save_steps=2, learning_rate=0.1, warmup_ratio=0.0, lr_scheduler_type="constant")
    args |= dict(optim="sgd", distill_weight=0.5, distill_epochs=2, distill_confident_share=0.6)
    out = tmp_path / "run"

    def run(resume: bool = False) -> dict[str, torch.Tensor]:
        config = _config(out, **args)
        train_recommender(
            catalogue, index, config, model_path=model_dir, fmt=SEQ, lora=dict(r=2), resume=resume
        )
        return load_file(str(out / "adapter" / "adapter_model.safetensors"))

    caplog.set_level(logging.INFO, logger=dist.__name__)
    whole = run()
    assert "soft targets from a teacher fitted now" in caplog.text
    log = json.loads((out / "log_history.json").read_text())
    assert (
        all(e["distill_loss"] > 0 for e in log if "loss" in e) and len([e for e in log if "loss" in e]) == 4
    )
    teacher_dir = out / "teacher"
    files = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in teacher_dir.iterdir()}
    assert {"teacher.json", "targets.safetensors", "sasrec.json", "sasrec.safetensors"} <= set(files)
    distillation = json.loads((out / "run.json").read_text())["distillation"]
    assert distillation["weight"] == 0.5 and distillation["confident_share"] == 0.6
    shutil.rmtree(out / "checkpoint-4")
    shutil.rmtree(out / "adapter")  # as if killed after the checkpoint at step 2
    caplog.clear()
    resumed = run(resume=True)
    targets = sum(len(u.history) - 1 for u in catalogue.leave_one_out().users)
    assert f"the teacher's {targets} soft targets from {out / 'teacher'}" in caplog.text
    assert "fitted now" not in caplog.text
    # the cached teacher and targets, untouched (the run's manifest fingerprints the rows, targets included)
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in teacher_dir.iterdir()} == files
    assert set(resumed) == set(whole)
    for name, tensor in whole.items():
        torch.testing.assert_close(resumed[name], tensor, rtol=1e-5, atol=1e-7)
    again = [e["loss"] for e in json.loads((out / "log_history.json").read_text()) if "loss" in e]
    assert again == pytest.approx([e["loss"] for e in log if "loss" in e], rel=1e-5)


def test_the_teacher_is_bounded_in_epochs_and_reproducible(toy):
    catalogue, index = toy
    split = catalogue.leave_one_out()
    first, again = (dist.fit_teacher(split, index, epochs=3, seed=0) for _ in range(2))
    assert len(first.history) <= 3
    for (name, a), (_, b) in zip(
        first.model.state_dict().items(), again.model.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name  # no time budget: the same split and seed give the same teacher


@pytest.mark.parametrize("disable_tqdm", [False, True])
def test_the_teacher_s_fit_shows_its_epochs_as_training_does(
    toy, tokenizer, tmp_path, monkeypatch, capsys, disable_tqdm
):
    """``sft`` fits its teacher for minutes before the first step: the fit shows its epochs, their validation
    Recall and the time left on stderr, as the trainer's progress bar does, and not with ``--disable_tqdm``."""
    from functools import partial

    catalogue, index = toy
    monkeypatch.setenv("PEFT_GROUNDED_CACHE", str(tmp_path / "cache"))  # a fit, not an earlier test's
    split = catalogue.leave_one_out()
    tokenizer.add_tokens(list(index.token_strings))
    config = _config(tmp_path / "run", distill_weight=0.5, distill_epochs=3, disable_tqdm=disable_tqdm)
    build = partial(training_dataset, split, index, catalogue, fmt=SEQ)
    dist.with_teacher(build, split, index, config, tokenizer, fmt=SEQ)
    err = capsys.readouterr().err
    teacher = SASRecRecommender.load(tmp_path / "run" / dist.TEACHER_DIR)
    if disable_tqdm:
        assert "SASRec" not in err
        return
    last = teacher.history[-1]
    assert f"SASRec: epoch {len(teacher.history)} of at most 3" in err
    assert f"valid Recall@10 {last['valid_recall@10']:.4f}" in err
    assert f"best epoch {teacher.best_epoch}, about " in err and " left]" in err
