"""Next-item data, inference prompts that continue into the SID, and the strategy runner end to end."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from helpers.toy_catalogue import toy_catalogue, toy_index

from peft_grounded.evaluation import EvalSettings
from peft_grounded.pipeline import Budget, Experiment, run_strategy
from peft_grounded.pipeline.side_by_side import strategy_curve
from peft_grounded.prompts import HistoryError, PromptFormat, inference_prompts
from peft_grounded.sids.extended_base import RowStart, read_sid_record
from peft_grounded.training.runs import RunMismatchError
from peft_grounded.training.sft import recommendation_examples, training_dataset


@pytest.fixture(scope="module")
def toy():
    catalogue = toy_catalogue()
    return catalogue, toy_index(catalogue)


def test_sliding_windows_with_a_maximum_history(toy, tokenizer):
    catalogue, index = toy
    split = catalogue.leave_one_out()
    fmt = PromptFormat(max_history=2, with_titles=True)
    dataset = training_dataset(split, index, catalogue, tokenizer, fmt)
    expected = sum(len(u.history) - 1 for u in split.users)
    assert len(dataset) == expected
    row = dataset[0]
    user = split.users[0]
    assert row["completion"] == [{"role": "assistant", "content": index.sid_text(user.history[1])}]
    assert index.sid_text(user.history[0]) in row["prompt"][-1]["content"]
    assert f'"{catalogue.items[user.history[0]].title}"' in row["prompt"][-1]["content"]
    longest = max(r["prompt"][-1]["content"].count("<a_") for r in dataset)
    assert longest == 2  # at most max_history items


def test_inference_prompt_ends_where_the_sid_starts(toy, tokenizer):
    catalogue, index = toy
    tokenizer.add_tokens(index.token_strings)
    split = catalogue.leave_one_out()
    example = next(split.test_examples())
    _, prompts, targets = inference_prompts([example], index, tokenizer, catalogue)
    row = recommendation_examples([example], index, catalogue)[0]
    full = tokenizer.apply_chat_template(row["prompt"] + row["completion"], tokenize=False)
    assert full.startswith(prompts[0] + index.sid_text(targets[0]))
    plain = inference_prompts([example], index, tokenizer, catalogue, chat=False)[1][0]
    assert plain.endswith("Answer:")


def test_bad_histories(toy):
    _, index = toy
    with pytest.raises(HistoryError, match="no SID"):
        recommendation_examples([("u", ("0", "missing-item"), "1")], index)
    with pytest.raises(HistoryError, match="empty history"):
        recommendation_examples([("u", (), "1")], index)
    with pytest.raises(HistoryError, match="Target item"):
        recommendation_examples([("u", ("0",), "nope")], index)


def test_runner_trains_evaluates_and_resumes(toy, model_dir, tmp_path):
    catalogue, index = toy
    experiment = Experiment(model_dir, catalogue, index)
    budget = Budget.from_training(
        dict(per_device_train_batch_size=4, save_steps=1, logging_steps=1, disable_tqdm=True),
        grounding=dict(max_steps=2),
        sft=dict(max_steps=2),
        lora=dict(r=2),
        evaluation=EvalSettings(users=6, num_beams=10, ks=(1, 5, 10)),
        eval_every=1,
        curve_users=3,
    )
    out = tmp_path / "centroid_gti"
    record = run_strategy("centroid_gti", experiment, budget, out)
    assert set(record["metrics"]) == {"valid", "test"}
    test = record["metrics"]["test"]
    assert test["all"]["users"] == 6 and "recall@10" in test["all"] and "cold" in test
    assert test["decoding"]["invalid"] == 0 and test["decoding"]["invalid_rate"] == 0
    assert [p["step"] for p in record["validation_curve"]] == [1, 2]
    points = strategy_curve(record)  # the learning curve: training minutes of each validation point
    assert [v for _, v in points] == [p["recall@10"] for p in record["validation_curve"]]
    assert 0 < points[0][0] <= points[1][0] <= record["timings"]["sft_s"] / 60
    for stage in ("init", "grounding", "sft"):
        assert (out / stage / "adapter" / "adapter_model.safetensors").is_file()
    assert json.loads((out / "metrics.json").read_text())["metrics"] == record["metrics"]
    with pytest.raises(RunMismatchError, match="resume=True"):
        run_strategy("centroid_gti", experiment, budget, out)
    again = run_strategy("centroid_gti", experiment, budget, out, resume=True)  # finished stages are loaded
    assert again["metrics"]["test"]["all"] == record["metrics"]["test"]["all"]
    likelihood = record["likelihood"]["test"]["all"]  # on the same users as the metrics
    assert likelihood["users"] == 6 and 0 < likelihood["constrained_nll"] <= likelihood["nll"]
    assert record["likelihood"]["test"]["cold"]["users"] == test["cold"]["users"]
    # a run recorded before likelihoods existed gets them on resume, from its saved SFT adapter
    older = {k: v for k, v in record.items() if k != "likelihood"}
    (out / "metrics.json").write_text(json.dumps(older))
    added = run_strategy("centroid_gti", experiment, budget, out, resume=True)["likelihood"]["test"]["all"]
    for name in ("nll", "constrained_nll", "uniform_nll"):
        assert added[name] == pytest.approx(likelihood[name], rel=1e-4)
    assert "likelihood" in json.loads((out / "metrics.json").read_text())
    changed = replace(budget, sft=replace(budget.sft, max_steps=3))
    with pytest.raises(RunMismatchError, match=r"budget\.sft\.max_steps"):
        run_strategy("centroid_gti", experiment, changed, out, resume=True)
    # another tool's metrics.json in the run folder is never read back as this run's results
    (out / "metrics.json").write_text(json.dumps({"recall@10": 0.5}))
    with pytest.raises(RunMismatchError, match="not this run's results"):
        run_strategy("centroid_gti", experiment, budget, out, resume=True)


def test_runner_sequence_objective_on_a_bf16_base_writes_learning_curves(toy, model_dir, tmp_path):
    """The sequence objective end to end through the runner, on a bf16 base (adapter weights fp32), with a
    time budget and the learning curves (progressive loss + validation NLL) in curve.json."""
    from safetensors.torch import load_file

    catalogue, index = toy
    fmt = PromptFormat(objective="sequence", max_history=4)
    experiment = Experiment(model_dir, catalogue, index, fmt=fmt)
    budget = Budget.from_training(
        dict(per_device_train_batch_size=4, logging_steps=1, disable_tqdm=True),
        grounding=dict(max_steps=2),
        sft=dict(
            max_steps=4, max_minutes=5
        ),  # the step limit comes first here; the schedule follows the time
        lora=dict(r=2),
        evaluation=EvalSettings(users=4, num_beams=10, ks=(1, 5, 10)),
        curve_every=2,
        curve_users=3,
        weights_dtype="bf16",
    )
    out = tmp_path / "gti"
    record = run_strategy("gti", experiment, budget, out)
    assert record["metrics"]["test"]["decoding"]["invalid"] == 0
    curve = json.loads((out / "curve.json").read_text())
    assert curve == record["curve"] and set(curve) == {"grounding", "sft"}
    train, valid = curve["sft"]["train"], curve["sft"]["valid"]
    assert [p["step"] for p in train] == [1, 2, 3, 4]  # 12 chunks: 3 steps make the first epoch
    assert [p["progressive"] for p in train] == [True, True, True, False]
    assert [p["step"] for p in valid] == [2, 4] and all(p["users"] == 3 and p["nll"] > 0 for p in valid)
    assert valid[-1]["items_seen"] == train[-1]["items_seen"] > 0
    for stage in ("grounding", "sft"):
        saved = load_file(str(out / stage / "adapter" / "adapter_model.safetensors"))
        assert {t.dtype for t in saved.values()} == {torch.float32}, stage

    assert read_sid_record(out / "sft" / "adapter")["prompt_format"]["objective"] == "sequence"


def test_validation_curve_survives_a_resume():
    """A resumed run restores the curve points logged before its checkpoint (they are in the trainer state)."""
    from transformers import TrainerControl, TrainerState

    from peft_grounded.training.sft import ValidationRecall

    def evaluate(model):
        return {"recall@5": 0.5, "recall@10": 0.75, "users": 4}

    state = TrainerState()
    state.log_history = [
        {"step": 1, "loss": 2.0, "learning_rate": 1e-3},
        {"step": 2, "eval_recall@5": 0.25, "eval_recall@10": 0.5, "eval_users": 4},
        {"step": 2, "loss": 1.5, "learning_rate": 1e-3},
    ]
    state.global_step = 4
    callback = ValidationRecall(evaluate, every=2)
    callback.on_train_begin(None, state, TrainerControl())
    callback.on_step_end(None, state, TrainerControl())
    assert callback.curve == [
        {"step": 2, "recall@5": 0.25, "recall@10": 0.5, "users": 4},
        {"step": 4, "recall@5": 0.5, "recall@10": 0.75, "users": 4},
    ]
    fresh = ValidationRecall(evaluate, every=2)
    fresh.on_train_begin(None, TrainerState(), TrainerControl())
    assert fresh.curve == []


def test_base_models_load_from_safetensors_only(tmp_path, tiny_model_factory, tokenizer):
    """As the README promises: a checkpoint with pickled weights only is refused, never unpickled."""
    import torch

    from peft_grounded.sids.extended_base import load_base

    path = tmp_path / "pickled"
    model = tiny_model_factory("llama", True)
    model.config.save_pretrained(path)
    tokenizer.save_pretrained(path)
    torch.save(model.state_dict(), path / "pytorch_model.bin")
    with pytest.raises(OSError, match="safetensors"):
        load_base(str(path))


def test_a_live_model_needs_its_tokenizer():
    from peft_grounded.sids.extended_base import model_for

    with pytest.raises(ValueError, match=r"ground\(model=\.\.\.\) needs the model's tokenizer"):
        model_for(object(), model=object(), tokenizer=None, caller="ground")
    live, tokenizer = object(), object()
    assert model_for(object(), model=live, tokenizer=tokenizer, caller="ground") == (tokenizer, live)


def test_a_budget_record_holds_each_part_and_changes_with_any_setting():
    """A run's manifest stores Budget.record(): the stages' budgets and their other non-default settings, the
    LoRA, the evaluation and the runner's fields, so that a resume with other settings is refused."""
    record = Budget().record()
    assert (
        record["seed"] == 0 and record["sft"]["max_steps"] == 400 and record["grounding"]["max_steps"] == 200
    )
    assert (
        record["lora"]["r"] == 16
        and record["evaluation"]["num_beams"] == 20
        and record["start"]["init_scale"] == 1.0
    )
    assert json.loads(json.dumps(record)) == json.loads(json.dumps(Budget().record()))
    changed = Budget.from_training(dict(warmup_ratio=0.1), grounding=dict(per_device_train_batch_size=4))
    assert changed.record()["grounding"]["warmup_ratio"] == changed.record()["sft"]["warmup_ratio"] == 0.1
    assert changed.record()["grounding"]["per_device_train_batch_size"] == 4
    assert "warmup_ratio" not in record["sft"]  # at its default
    assert Budget(keep_best=True, eval_every=1).record() != Budget(eval_every=1).record()
    assert Budget(evaluation=EvalSettings(users=5)).record()["evaluation"]["users"] == 5
    # where the stages write and whether a progress bar shows do not change a run
    quiet = Budget.from_training(dict(disable_tqdm=True, output_dir="elsewhere"))
    assert quiet.record() == Budget.from_training().record()


def test_runner_starts_every_strategy_at_the_budgets_init_scale(toy, model_dir, tmp_path):
    from peft_grounded.sids.extended_base import sid_model

    catalogue, index = toy
    budget = Budget.from_training(
        dict(per_device_train_batch_size=2, save_steps=5, logging_steps=1, disable_tqdm=True),
        grounding=False,
        sft=dict(max_steps=1),
        lora=dict(r=2),
        evaluation=EvalSettings(users=2, num_beams=5, ks=(1, 5)),
        eval_parts=("test",),
        start=RowStart(init_scale=0.25),
    )
    assert budget.record()["start"]["init_scale"] == 0.25 and Budget().record()["start"]["init_scale"] == 1.0
    with pytest.raises(ValueError, match="init_scale"):
        Budget(start=RowStart(init_scale=0.0))
    run_strategy("centroid", Experiment(model_dir, catalogue, index), budget, tmp_path / "run")
    config = json.loads((tmp_path / "run" / "init" / "adapter" / "adapter_config.json").read_text())
    assert config["init_scale"] == 0.25 and config["init"] == "centroid"
    # the saved start is the plain centroid start pulled a quarter of the way out from the vocabulary mean
    _, full = sid_model(model_dir, index, start=RowStart(init="centroid"))
    from safetensors.torch import load_file

    saved = load_file(tmp_path / "run" / "init" / "adapter" / "adapter_model.safetensors")
    key = next(k for k in saved if "grounded_embedding" in k)
    rows = full.get_input_embeddings().grounded_embedding["default"].detach().double()
    vocab = full.get_input_embeddings().base_layer.weight[: min(full.peft_config["default"].token_indices)]
    mean = vocab.detach().double().mean(0)
    torch.testing.assert_close(saved[key].double() - mean, 0.25 * (rows - mean), rtol=1e-4, atol=1e-5)


def _trainable(model) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def _keep_best_config(tmp_path):
    """Three SFT steps into tmp_path/sft, one checkpoint at the end: the keep_best tests' run."""
    from peft_grounded.training.sft import RecommendationConfig

    return RecommendationConfig(
        output_dir=str(tmp_path / "sft"),
        max_steps=3,
        learning_rate=0.05,
        per_device_train_batch_size=4,
        save_steps=3,
        logging_steps=1,
        disable_tqdm=True,
    )


def test_keep_best_ends_with_the_adapter_of_the_best_validation_point(toy, model_dir, tmp_path):
    """keep_best: the written adapter is the one of the highest validation Recall@10 (here step 2 of 3), not
    the last step's; the snapshot folder keeps that one only once a checkpoint covers it."""
    from safetensors.torch import load_file

    from peft_grounded.training.sft import ValidationRecall, train_recommender

    catalogue, index = toy
    values, states = iter([0.1, 0.3, 0.2]), {}

    def scripted(model):  # the validation measure, scripted so that the best point is known
        states[len(states) + 1] = _trainable(model)
        return {"recall@10": next(values), "users": 3}

    best = tmp_path / "best"
    callback = ValidationRecall(scripted, every=1, keep_best="recall@10", directory=best)
    config = _keep_best_config(tmp_path)
    model = train_recommender(
        catalogue, index, config, model_path=model_dir, lora=dict(r=2), callbacks=[callback]
    )
    assert callback.best == (2, 0.3) and sorted(p.name for p in best.iterdir()) == ["step-2"]
    live = _trainable(model)
    assert all(torch.equal(live[n], states[2][n]) for n in live)
    assert any(not torch.equal(states[2][n], states[3][n]) for n in live)  # step 3 did move the weights
    saved = load_file(str(tmp_path / "sft" / "adapter" / "adapter_model.safetensors"))
    snapshot = load_file(str(best / "step-2" / "adapter_model.safetensors"))
    assert saved.keys() == snapshot.keys() and all(torch.equal(saved[k], snapshot[k]) for k in saved)
    log = json.loads((tmp_path / "sft" / "log_history.json").read_text())
    assert {"step": 3, "restored_best_step": 2, "restored_best_recall@10": 0.3} in log
    # killed after its last checkpoint, before its adapter: the resume writes the best adapter too
    import shutil

    shutil.rmtree(tmp_path / "sft" / "adapter")
    (tmp_path / "sft" / "log_history.json").unlink()
    again = ValidationRecall(scripted, every=1, keep_best="recall@10", directory=best)
    train_recommender(
        catalogue, index, config, model_path=model_dir, lora=dict(r=2), callbacks=[again], resume=True
    )
    resumed = load_file(str(tmp_path / "sft" / "adapter" / "adapter_model.safetensors"))
    assert again.best == (2, 0.3) and all(torch.equal(resumed[k], snapshot[k]) for k in saved)


@pytest.mark.parametrize("final_wins", [True, False])
def test_keep_best_evaluates_the_last_weights_too(toy, model_dir, tmp_path, final_wins):
    """A budget that does not end on a validation step: the last weights are evaluated at the end and are a
    candidate like the others (kept live when they win, the snapshot loaded back when they lose)."""
    from peft_grounded.training.sft import ValidationRecall, train_recommender

    catalogue, index = toy
    values = iter([0.1, 0.3] if final_wins else [0.3, 0.1])
    states = {}

    def scripted(model):
        states[len(states) + 1] = _trainable(model)
        return {"recall@10": next(values), "users": 3}

    callback = ValidationRecall(scripted, every=2, keep_best="recall@10", directory=tmp_path / "best")
    config = _keep_best_config(tmp_path)
    model = train_recommender(
        catalogue, index, config, model_path=model_dir, lora=dict(r=2), callbacks=[callback]
    )
    steps = [p["step"] for p in callback.curve]
    assert steps == [2, 3] and len(states) == 2  # the regular point and the final one
    assert any(not torch.equal(states[1][n], states[2][n]) for n in states[1])
    kept = states[2] if final_wins else states[1]
    live = _trainable(model)
    assert all(torch.equal(live[n], kept[n]) for n in live)
    log = json.loads((tmp_path / "sft" / "log_history.json").read_text())
    restored = {"step": 3, "restored_best_step": 3 if final_wins else 2, "restored_best_recall@10": 0.3}
    assert restored in log
    assert [e["step"] for e in log if "eval_recall@10" in e] == [2, 3]


def test_keep_best_after_a_resume_keeps_the_snapshot_its_log_knows(tmp_path):
    """A resumed run: the best point of the checkpoint's log whose snapshot is on disk; snapshots of the steps
    it trains again, and leftovers of a killed write, are removed."""
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from peft_grounded.training.sft import ValidationRecall

    best = tmp_path / "best"
    for name in ("step-2", "step-4", "step-6", ".tmp-killed-write"):
        (best / name).mkdir(parents=True)
    for name in ("step-2", "step-4", "step-6"):
        (best / name / "adapter_model.safetensors").write_bytes(b"")
    state = TrainerState()
    state.global_step = 5  # the checkpoint: points at 2 and 4 logged, the one at 6 is trained again
    state.log_history = [
        {"step": 2, "eval_recall@10": 0.2},
        {"step": 4, "eval_recall@10": 0.4},
    ]
    args = TrainingArguments(output_dir=str(tmp_path / "run"), report_to="none")
    callback = ValidationRecall(lambda m: {}, every=2, keep_best="recall@10", directory=best)
    callback.on_train_begin(args, state, TrainerControl())
    assert callback.best == (4, 0.4) and [p.name for p in best.iterdir()] == ["step-4"]
    with pytest.raises(ValueError, match="needs validation points"):
        ValidationRecall(lambda m: {}, every=0, keep_best="recall@10", directory=best)


def test_the_runner_keeps_the_best_validation_adapter_when_asked(toy, model_dir, tmp_path):
    catalogue, index = toy
    budget = Budget.from_training(
        dict(per_device_train_batch_size=2, save_steps=5, logging_steps=1, disable_tqdm=True),
        grounding=False,
        sft=dict(max_steps=3, learning_rate=0.05),
        lora=dict(r=2),
        evaluation=EvalSettings(users=2, num_beams=5, ks=(1, 5, 10)),
        eval_parts=("test",),
        eval_every=1,
        curve_users=3,
        keep_best=True,
    )
    assert budget.record()["keep_best"] is True and Budget().record()["keep_best"] is False
    with pytest.raises(ValueError, match="keep_best needs validation points"):
        replace(budget, eval_every=0)
    record = run_strategy("centroid", Experiment(model_dir, catalogue, index), budget, tmp_path / "run")
    points = record["validation_curve"]
    assert [p["step"] for p in points] == [1, 2, 3]
    best = max(points, key=lambda p: p["recall@10"])  # the first of equal values, as the callback keeps
    log = json.loads((tmp_path / "run" / "sft" / "log_history.json").read_text())
    restored = [e for e in log if "restored_best_step" in e]
    assert restored == [
        {"step": 3, "restored_best_step": best["step"], "restored_best_recall@10": best["recall@10"]}
    ]
