"""The SID-only softmax: with every row allowed it is the full loss; over the SID rows it is the reference
restricted softmax, with gradients exactly where they belong (tied and untied, Llama and Qwen3); the
trainer records it in the adapter, refuses it where it cannot apply, and a run with it resumes."""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import torch
from helpers.toy_catalogue import toy_catalogue, toy_index
from peft import get_peft_model
from trl.trainer.utils import add_fused_lm_head

import peft_grounded
from peft_grounded import GroundedTokenConfig
from peft_grounded.adapter import add_lora
from peft_grounded.prompts import PromptFormat
from peft_grounded.sid_head import compact_fused_forward, compact_head
from peft_grounded.sids.extended_base import read_sid_record, sid_record, sid_softmax_of
from peft_grounded.training.sft import RecommendationConfig, train_recommender, training_dataset

CASES = [("llama", True), ("llama", False), ("qwen3", True), ("qwen3", False)]
SEQ = PromptFormat(objective="sequence", max_history=3)


def setup(tokenizer, factory, arch, tied):
    base = factory(arch, tied, extra_rows=64 if arch == "qwen3" else 0)
    new = peft_grounded.add_sid_tokens(tokenizer, base, [8, 8])
    model = get_peft_model(
        base, GroundedTokenConfig(token_indices=new, init="gaussian", task_type="CAUSAL_LM")
    )
    add_lora(model, r=2, target_modules=["q_proj", "v_proj"])
    torch.manual_seed(1)
    for (
        name,
        param,
    ) in model.named_parameters():  # LoRA B starts at 0: give it values so that A gets a gradient
        if "lora_B" in name:
            param.data.normal_(0, 0.02)
    add_fused_lm_head(model.get_base_model(), outputs=("log_probs", "entropy", "is_top1"))
    return model, new


def batch(new):
    """Two rows; targets (labels shifted by one) mix SID tokens and text tokens, some positions unlabelled."""
    ids = torch.tensor(
        [[1, 17, new[0], new[-1], 400, new[3], 9, new[6]], [5, new[1], 300, 301, new[-2], 7, 8, 2]]
    )
    labels = ids.clone()
    labels[0, :2] = -100
    return {"input_ids": ids, "labels": labels}


def trainable_grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def run(model, inputs, sid_softmax: bool = False):
    model.zero_grad()
    sid_ids = model.base_model.grounded_token_ids() if sid_softmax else None
    with compact_head(model, sid_ids=sid_ids):
        out = model(**inputs, fused_lm_head=True)
    out.loss.backward()
    return out, trainable_grads(model)


@pytest.mark.parametrize(("arch", "tied"), CASES)
def test_every_row_allowed_is_the_full_loss(tokenizer, tiny_model_factory, arch, tied):
    model, new = setup(tokenizer, tiny_model_factory, arch, tied)
    inputs = batch(new)
    full, expected = run(model, inputs)
    vocab = model.get_input_embeddings().base_layer.weight.shape[0]
    model.zero_grad()
    every = compact_fused_forward(model.get_base_model(), **inputs, sid_ids=torch.arange(vocab))
    every.loss.backward()
    torch.testing.assert_close(every.loss, full.loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(every.log_probs, full.log_probs, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(every.entropy, full.entropy, rtol=1e-5, atol=1e-5)
    assert torch.equal(every.is_top1, full.is_top1) and torch.equal(every.label_mask, full.label_mask)
    got = trainable_grads(model)
    assert set(got) == set(expected) and any("lora_A" in n for n in got)
    for name, grad in got.items():
        # float32 summation order differs with the CPU kernels (AVX2: up to 1.5e-7 on a row gradient)
        torch.testing.assert_close(grad, expected[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize(("arch", "tied"), CASES)
def test_sid_targets_are_normalised_over_the_sid_rows(tokenizer, tiny_model_factory, arch, tied):
    """Against a reference from the model's full logits: SID targets log-softmaxed over the SID columns,
    text targets over the whole vocabulary; the same loss and the same gradients."""
    model, new = setup(tokenizer, tiny_model_factory, arch, tied)
    inputs = batch(new)
    out, got = run(model, inputs, sid_softmax=True)
    model.zero_grad()
    logits = model(input_ids=inputs["input_ids"]).logits[:, :-1].float()
    targets = inputs["labels"][:, 1:]
    sid = torch.tensor(sorted(new))
    mask = targets != -100
    is_sid = torch.isin(targets, sid)
    full = logits.log_softmax(-1).gather(-1, targets.clamp(min=0)[..., None])[..., 0]
    column = torch.searchsorted(sid, targets.clamp(min=0)).clamp(max=len(sid) - 1)
    restricted = logits[..., sid].log_softmax(-1).gather(-1, column[..., None])[..., 0]
    reference = torch.where(is_sid, restricted, full).masked_fill(~mask, 0)
    loss = -reference.sum() / mask.sum()
    loss.backward()
    expected = trainable_grads(model)
    assert is_sid[mask].any() and (~is_sid[mask]).any()  # both kinds of target are in the batch
    torch.testing.assert_close(out.log_probs, reference, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.loss, loss, rtol=1e-5, atol=1e-6)
    assert (out.log_probs[is_sid & mask] > full[is_sid & mask]).all()  # less mass to share: likelier
    for name, grad in got.items():
        torch.testing.assert_close(
            grad, expected[name], rtol=1e-3, atol=1e-5, msg=name
        )  # float32 order differs by CPU


@pytest.mark.parametrize(("arch", "tied"), CASES)
def test_gradients_reach_exactly_the_allowed_rows_and_the_lora(tokenizer, tiny_model_factory, arch, tied):
    """Only SID targets, softmax over half the SID rows: the output rows of the other half get no gradient
    (tied: unless they are inputs), every LoRA weight gets one, the frozen base none."""
    model, new = setup(tokenizer, tiny_model_factory, arch, tied)
    allowed, other = sorted(new[:8]), new[8:]
    ids = torch.tensor(
        [[1, allowed[0], allowed[3], allowed[5], allowed[1]], [5, allowed[2], allowed[7], 9, 2]]
    )
    labels = ids.clone()
    labels[1, 3:] = -100  # every target is an allowed SID token
    model.zero_grad()
    out = compact_fused_forward(
        model.get_base_model(), input_ids=ids, labels=labels, sid_ids=torch.tensor(allowed)
    )
    out.loss.backward()
    layer = model.get_input_embeddings()
    rows = layer.grounded_embedding["default"].grad
    position = {token: i for i, token in enumerate(new)}
    assert rows[[position[t] for t in other]].abs().sum() == 0  # not in the softmax, not an input
    if tied:
        assert (rows[[position[t] for t in allowed]].abs().sum(-1) > 0).all()
    else:
        head = layer.grounded_head["default"].grad
        assert (head[[position[t] for t in allowed]].abs().sum(-1) > 0).all()
        assert head[[position[t] for t in other]].abs().sum() == 0
        inputs = {position[t] for t in ids[:, :-1].flatten().tolist() if t in position}
        assert rows[sorted(set(range(len(new))) - inputs)].abs().sum() == 0  # input rows: only those fed
    for name, param in model.named_parameters():
        if param.requires_grad:
            assert param.grad is not None and param.grad.abs().sum() > 0, name
        else:
            assert param.grad is None, name


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
        sid_softmax=True,
    )
    return RecommendationConfig(**(base | kw))


def test_a_run_records_it_and_resumes(toy, model_dir, tmp_path):
    """A sequence-objective run with the SID-only softmax records it in the adapter, and a run killed after
    its checkpoint at step 2 resumes to the same adapter as the uninterrupted run."""
    from safetensors.torch import load_file

    catalogue, index = toy
    args = dict(max_steps=4, save_steps=2)
    whole, out = tmp_path / "whole", tmp_path / "resumed"
    torch.manual_seed(0)  # the LoRA's initialisation draws from the global generator
    model = train_recommender(
        catalogue, index, _config(whole, **args), model_path=model_dir, fmt=SEQ, lora=dict(r=2)
    )
    assert sid_softmax_of(model)
    assert read_sid_record(whole / "adapter")["sid_softmax"] is True
    torch.manual_seed(0)
    train_recommender(catalogue, index, _config(out, **args), model_path=model_dir, fmt=SEQ, lora=dict(r=2))
    shutil.rmtree(out / "checkpoint-4")
    shutil.rmtree(out / "adapter")  # as if killed after the checkpoint at step 2
    train_recommender(
        catalogue, index, _config(out, **args), model_path=model_dir, fmt=SEQ, lora=dict(r=2), resume=True
    )
    a = load_file(str(whole / "adapter" / "adapter_model.safetensors"))
    b = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-5, atol=1e-6, msg=key)
    losses = [e["loss"] for e in json.loads((out / "log_history.json").read_text()) if "loss" in e]
    assert len(losses) == 4 and all(0 < v < 20 for v in losses)


def test_changing_it_on_resume_is_refused(toy, model_dir, tmp_path):
    from peft_grounded.training.runs import RunMismatchError

    catalogue, index = toy
    out = tmp_path / "run"
    args = dict(max_steps=2, save_steps=1)
    train_recommender(catalogue, index, _config(out, **args), model_path=model_dir, fmt=SEQ, lora=dict(r=2))
    shutil.rmtree(out / "adapter")
    with pytest.raises(RunMismatchError):
        train_recommender(
            catalogue,
            index,
            _config(out, sid_softmax=False, **args),
            model_path=model_dir,
            fmt=SEQ,
            lora=dict(r=2),
            resume=True,
        )


def test_full_softmax_is_recorded_as_false_and_the_prompt_objective_trains(toy, model_dir, tmp_path):
    catalogue, index = toy
    model = train_recommender(
        catalogue,
        index,
        _config(tmp_path / "full", max_steps=1, sid_softmax=False),
        model_path=model_dir,
        lora=dict(r=2),
    )
    assert not sid_softmax_of(model) and sid_record(model)["sid_softmax"] is False
    prompt = train_recommender(  # chat prompt objective: the end-of-turn targets keep the full vocabulary
        catalogue, index, _config(tmp_path / "prompt", max_steps=1), model_path=model_dir, lora=dict(r=2)
    )
    assert sid_softmax_of(prompt)


def test_refused_where_it_cannot_apply(toy, model_dir, tmp_path):
    catalogue, index = toy
    with pytest.raises(ValueError, match="sid_softmax=True needs TRL's fused loss"):
        train_recommender(
            catalogue,
            index,
            _config(tmp_path / "smooth", max_steps=1, label_smoothing_factor=0.1),
            model_path=model_dir,
            fmt=SEQ,
        )


def test_the_compact_head_refuses_a_fused_call_it_cannot_score(tokenizer, tiny_model_factory):
    """A fused-head call with pre-shifted labels cannot take the SID-only softmax: refused, not scored over
    the whole vocabulary; a call without the fused head runs the model's own forward."""
    model, new = setup(tokenizer, tiny_model_factory, "llama", True)
    inputs = batch(new)
    own = model.get_base_model().__dict__.get("forward")  # TRL's fused-head forward, set on the instance
    with compact_head(model, sid_ids=model.base_model.grounded_token_ids()):
        with pytest.raises(ValueError, match="the SID-only softmax scores TRL's fused head"):
            model(**inputs, fused_lm_head=True, shift_labels=inputs["labels"])
        logits = model(input_ids=inputs["input_ids"]).logits
    assert torch.equal(logits, model(input_ids=inputs["input_ids"]).logits)
    assert model.get_base_model().__dict__.get("forward") is own  # the model's own forward is back


def test_copying_a_model_keeps_its_record(tokenizer, tiny_model_factory):
    from peft_grounded.training.sft.recommendation_trainer import record_sid_softmax

    model, _ = setup(tokenizer, tiny_model_factory, "llama", False)
    record_sid_softmax(model, True)
    assert sid_softmax_of(copy.deepcopy(model))
    record_sid_softmax(model, False)
    assert not sid_softmax_of(model)


def test_trls_loop_without_the_compact_head_takes_the_same_loss(toy, model_dir, tmp_path):
    """compact_loss=False (TRL's own fused head for the full softmax) still gets the SID-only loss."""
    from peft_grounded.sids.extended_base import RowStart, sid_model
    from peft_grounded.training.sft import RecommendationTrainer

    catalogue, index = toy
    tokenizer, model = sid_model(model_dir, index, start=RowStart(init="centroid"), fmt=SEQ)
    add_lora(model, r=2, target_modules="all-linear")
    data = training_dataset(catalogue.leave_one_out(), index, catalogue, tokenizer, SEQ)
    trainers = {
        (compact, sid): RecommendationTrainer(
            model,
            _config(tmp_path / f"c{compact}{sid}", max_steps=1, compact_loss=compact, sid_softmax=sid),
            train_dataset=data,
            processing_class=tokenizer,
        )
        for compact, sid in ((True, True), (False, True), (True, False))
    }
    batch = next(iter(trainers[True, True].get_train_dataloader()))
    model.train()
    losses = {key: trainer.compute_loss(model, dict(batch)).item() for key, trainer in trainers.items()}
    assert losses[False, True] == pytest.approx(losses[True, True], rel=1e-6)
    assert losses[True, True] < losses[True, False]  # fewer rows to share the mass with


def test_the_default_applies_it_wherever_it_can(toy, model_dir, tmp_path):
    """sid_softmax=None (the default): the SID-only softmax on a grounded adapter, the full head where it
    cannot apply (label smoothing); the trainer's args and the adapter's record say which runs."""
    from peft_grounded.sids.extended_base import RowStart, sid_model
    from peft_grounded.training.sft import RecommendationTrainer

    catalogue, index = toy
    assert RecommendationConfig(output_dir=str(tmp_path / "d")).sid_softmax is None
    tokenizer, model = sid_model(model_dir, index, start=RowStart(init="centroid"), fmt=SEQ)
    add_lora(model, r=2, target_modules="all-linear")
    data = training_dataset(catalogue.leave_one_out(), index, catalogue, tokenizer, SEQ)
    for name, extra in (("auto", {}), ("smooth", {"label_smoothing_factor": 0.1})):
        args = _config(tmp_path / name, max_steps=1, sid_softmax=None, **extra)
        trainer = RecommendationTrainer(model, args, train_dataset=data, processing_class=tokenizer)
        assert trainer.args.sid_softmax is (name == "auto") and sid_softmax_of(model) is (name == "auto")
    trained = train_recommender(
        catalogue,
        index,
        _config(tmp_path / "run", max_steps=1, sid_softmax=None),
        model_path=model_dir,
        fmt=SEQ,
        lora=dict(r=2),
    )
    assert sid_softmax_of(trained)
    assert read_sid_record(tmp_path / "run" / "adapter")["sid_softmax"] is True


def test_a_folder_without_its_record_decodes_the_whole_vocabulary_and_says_so(toy, model_dir, tmp_path):
    """PEFT's own save writes no SID record: such an adapter decodes over the whole vocabulary (what any other
    trainer taught it), with a warning naming the folder; the package's save keeps the record."""
    from peft_grounded.sids.extended_base import RowStart, save_sid_record, sid_model
    from peft_grounded.training.sft.recommendation_trainer import record_sid_softmax

    _, index = toy
    _, model = sid_model(model_dir, index, start=RowStart(init="centroid"), fmt=SEQ)
    record_sid_softmax(model, True)
    model.save_pretrained(tmp_path / "peft")
    model.save_pretrained(tmp_path / "kept")
    save_sid_record(model, tmp_path / "kept")
    _, plain = sid_model(model_dir, index, adapter=str(tmp_path / "peft"))
    with pytest.warns(UserWarning, match=f"{tmp_path / 'peft'} has no sid_record.json"):
        assert sid_softmax_of(plain) is False
    _, kept = sid_model(model_dir, index, adapter=str(tmp_path / "kept"))
    assert sid_softmax_of(kept) is True and read_sid_record(tmp_path / "kept")["sid_softmax"] is True
