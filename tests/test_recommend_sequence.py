"""The sequence objective: exact loss masks, every transition a target once, inference prompts that are the
training rows' prefixes, a tiny training run, the recorded format; and the trainer's time budget,
learning curves, fp32 master weights and refusals (truncation, a finished run's folder)."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict

import pytest
import torch
from helpers.toy_catalogue import toy_catalogue, toy_index

from peft_grounded.pipeline import Budget
from peft_grounded.prompts import PromptFormat, inference_prompts
from peft_grounded.sids.extended_base import read_sid_record
from peft_grounded.training.callbacks import learning_curve, time_schedule
from peft_grounded.training.runs import RunMismatchError
from peft_grounded.training.sft import RecommendationConfig, train_recommender, training_dataset
from peft_grounded.training.sft.data import chunk_bounds, sequence_row

SEQ = PromptFormat(objective="sequence", max_history=3)


@pytest.fixture(scope="module")
def toy():
    catalogue = toy_catalogue()
    return catalogue, toy_index(catalogue)


@pytest.fixture
def sid_tokenizer(toy, tokenizer):
    tokenizer.add_tokens(toy[1].token_strings)
    return tokenizer


def _sid_ids(tokenizer, index, item):
    return tokenizer(index.sid_text(item), add_special_tokens=False)["input_ids"]


def test_chunks_share_one_item_at_each_boundary():
    assert chunk_bounds(45, 20) == [(0, 20), (19, 39), (38, 45)]
    assert chunk_bounds(20, 20) == [(0, 20)]
    assert chunk_bounds(21, 20) == [(0, 20), (19, 21)]
    assert chunk_bounds(1, 20) == [] and chunk_bounds(5, None) == [(0, 5)]
    with pytest.raises(ValueError, match="at least 2 items"):
        chunk_bounds(5, 1)


def test_exact_mask_on_the_sids_of_items_two_to_n(toy, sid_tokenizer):
    catalogue, index = toy
    items = ("0", "5", "10")
    row = sequence_row(items, index, sid_tokenizer, catalogue, SEQ)
    sep = sid_tokenizer(" ", add_special_tokens=False)["input_ids"]
    expected_ids, expected_mask = [0], [0]  # <|endoftext|>
    for k, item in enumerate(items):
        sid = _sid_ids(sid_tokenizer, index, item)
        expected_ids += sid + sep
        expected_mask += [int(k > 0)] * len(sid) + [0] * len(sep)
    assert len(sep) == 1  # one separator token, never merged with a SID token
    assert row == {"input_ids": expected_ids, "completion_mask": expected_mask}
    titled = sequence_row(
        items, index, sid_tokenizer, catalogue, PromptFormat(objective="sequence", with_titles=True)
    )
    masked = [t for t, m in zip(titled["input_ids"], titled["completion_mask"], strict=True) if m]
    assert masked == _sid_ids(sid_tokenizer, index, "5") + _sid_ids(sid_tokenizer, index, "10")


def test_every_training_transition_is_a_target_once_per_epoch(toy, sid_tokenizer):
    catalogue, index = toy
    split = catalogue.leave_one_out()
    data = training_dataset(split, index, catalogue, sid_tokenizer, SEQ)
    assert data.column_names == ["input_ids", "completion_mask"]
    by_sid = {tuple(_sid_ids(sid_tokenizer, index, i)): i for i in index.item_ids}
    targets = Counter()
    for row in data:
        run: list[int] = []
        for token, bit in [*zip(row["input_ids"], row["completion_mask"], strict=True), (None, 0)]:
            if bit:
                run.append(token)
            elif run:
                targets[by_sid[tuple(run)]] += 1
                run = []
    expected = Counter(i for u in split.users for i in u.history[1:])
    assert targets == expected and sum(targets.values()) == sum(len(u.history) - 1 for u in split.users)
    assert len(data) == sum(len(chunk_bounds(len(u.history), 4)) for u in split.users)


@pytest.mark.parametrize("with_titles", [False, True])
def test_inference_prompt_is_the_training_rows_prefix(toy, sid_tokenizer, with_titles):
    catalogue, index = toy
    fmt = PromptFormat(objective="sequence", max_history=None, with_titles=with_titles, prefix="Watched:")
    split = catalogue.leave_one_out()
    for user, history, target in list(split.valid_examples())[:4]:
        row = sequence_row((*history, target), index, sid_tokenizer, catalogue, fmt)
        prompt = inference_prompts([(user, history, target)], index, sid_tokenizer, catalogue, fmt)[1][0]
        ids = sid_tokenizer(prompt, add_special_tokens=False)["input_ids"]
        sid = _sid_ids(sid_tokenizer, index, target)
        assert row["input_ids"][: len(ids)] == ids and row["input_ids"][len(ids) : len(ids) + len(sid)] == sid
        assert row["completion_mask"][len(ids) : len(ids) + len(sid)] == [1] * len(sid)


def test_format_errors():
    with pytest.raises(ValueError, match=r"\{history\}"):
        PromptFormat(instruction="Which item comes next?")
    with pytest.raises(ValueError, match="objective"):
        PromptFormat(objective="pairs")
    with pytest.raises(ValueError, match="separator"):
        PromptFormat(objective="sequence", separator="")
    assert Budget(weights_dtype="bf16").weights_dtype == "bfloat16"
    with pytest.raises(ValueError, match="weights_dtype"):
        Budget(weights_dtype="int8")
    with pytest.raises(ValueError, match="max_minutes must be a finite number > 0"):
        Budget.from_training(sft=dict(max_minutes=0))
    assert Budget().parts == ("valid", "test") and Budget(eval_parts=("test",)).parts == ("test",)
    with pytest.raises(ValueError, match="eval_parts"):
        Budget(eval_parts=("train",))


def test_time_schedule_warms_up_and_ends_at_zero():
    assert time_schedule(0.0, 0.1) == pytest.approx(1e-3)
    assert time_schedule(0.05, 0.1) == pytest.approx(0.5)
    assert time_schedule(0.1, 0.1) == pytest.approx(1.0)
    assert time_schedule(0.55, 0.1) == pytest.approx(0.5)
    assert time_schedule(1.0, 0.1) == 0.0 and time_schedule(2.0, 0.0) == 0.0


def _config(out, **kw) -> RecommendationConfig:
    base = dict(
        output_dir=str(out),
        per_device_train_batch_size=4,
        logging_steps=2,
        save_steps=1000,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        seed=0,
    )
    return RecommendationConfig(**(base | kw))


def _rows_loss(model_dir, index, catalogue, adapter: str | None = None) -> float:
    from peft_grounded.sids.extended_base import sid_model

    tokenizer, model = sid_model(model_dir, index, adapter=adapter, is_trainable=False)
    data = training_dataset(catalogue.leave_one_out(), index, catalogue, tokenizer, SEQ)
    losses = []
    with torch.no_grad():
        for row in data.select(range(min(16, len(data)))):
            keep = zip(row["input_ids"], row["completion_mask"], strict=True)
            labels = torch.tensor([[t if m else -100 for t, m in keep]])
            losses.append(model(input_ids=torch.tensor([row["input_ids"]]), labels=labels).loss.item())
    return sum(losses) / len(losses)


def test_sequence_training_lowers_the_loss_and_records_its_format(toy, model_dir, tmp_path):

    from peft_grounded.sids.extended_base import prompt_format_of, sid_model

    catalogue, index = toy
    out = tmp_path / "seq"
    lora = dict(r=2, lora_alpha=4, target_modules="all-linear")
    args = _config(out, max_steps=24, learning_rate=3e-2, warmup_ratio=0.0, lr_scheduler_type="constant")
    train_recommender(catalogue, index, args, model_path=model_dir, fmt=SEQ, lora=lora)
    log = json.loads((out / "log_history.json").read_text())
    # the loss on the same 16 training rows, untrained start against trained adapter (one batch per logged
    # point is noisy, and the noise differs between CPUs and kernels)
    trained = _rows_loss(model_dir, index, catalogue, str(out / "adapter"))
    start = _rows_loss(model_dir, index, catalogue)
    assert trained < 0.95 * start, (trained, start)
    curve = learning_curve(log)["train"]
    assert all(p["items_seen"] > 0 and p["seconds"] > 0 and p["item_nll"] > p["loss"] for p in curve)
    assert [p["items_seen"] for p in curve] == sorted(p["items_seen"] for p in curve)
    recorded = read_sid_record(out / "adapter")["prompt_format"]
    assert recorded == asdict(SEQ)
    _, model = sid_model(model_dir, index, adapter=str(out / "adapter"), is_trainable=False)
    assert prompt_format_of(model) == SEQ
    with pytest.raises(RunMismatchError, match="finished run"):  # never replaced silently
        train_recommender(catalogue, index, args, model_path=model_dir, fmt=SEQ, lora=lora)


def test_time_budget_stops_the_run(toy, model_dir, tmp_path):
    catalogue, index = toy
    out = tmp_path / "timed"
    args = _config(out, max_minutes=0.5 / 60, logging_steps=1)  # half a second, no step limit
    train_recommender(catalogue, index, args, model_path=model_dir, fmt=SEQ, lora=dict(r=2))
    log = json.loads((out / "log_history.json").read_text())
    steps = [e for e in log if "loss" in e]
    assert 1 <= len(steps) < 1000 and steps[-1]["seconds"] >= 0.5
    rates = [e["learning_rate"] for e in steps]
    # decaying towards 0 at the time limit (time_schedule's values are tested exactly above; on a loaded
    # machine a half-second budget may hold only a step or two, logged before the clock moved)
    assert len(steps) < 3 or rates[-1] < max(rates)


def test_a_time_budget_shows_its_progress_in_seconds(toy, model_dir, tmp_path, capfd):
    catalogue, index = toy
    args = _config(tmp_path / "bar", max_minutes=2 / 60, logging_steps=1, disable_tqdm=False)
    train_recommender(catalogue, index, args, model_path=model_dir, fmt=SEQ, lora=dict(r=2))
    err = capfd.readouterr().err
    assert "training time" in err and "/2 " in err  # a bar over the 2-second budget
    assert "1000000000" not in err  # not over the open step count


def test_rows_cut_by_max_length_are_refused(toy, model_dir, tmp_path):
    catalogue, index = toy
    with pytest.raises(ValueError, match="max_length=8"):
        train_recommender(
            catalogue,
            index,
            _config(tmp_path / "cut", max_steps=1, max_length=8),
            model_path=model_dir,
            fmt=SEQ,
        )
    prompt = PromptFormat(max_history=3)
    with pytest.raises(ValueError, match="reach max_length=40"):
        train_recommender(
            catalogue,
            index,
            _config(tmp_path / "cut2", max_steps=1, max_length=40),
            model_path=model_dir,
            fmt=prompt,
        )


def test_half_precision_base_trains_fp32_adapter_weights(toy, model_dir, tmp_path):
    """Every adapter weight (rows and LoRA) trains and is saved in float32 on a bf16 base (master weights).

    RunTrainer upcasts trainable half-precision weights itself; engineer "encdec"'s add_lora fix makes the
    LoRA fp32 at creation too (the lead checks both after merging)."""
    from safetensors.torch import load_file

    catalogue, index = toy
    out = tmp_path / "bf16"
    model = train_recommender(
        catalogue,
        index,
        _config(out, max_steps=2),
        model_path=model_dir,
        fmt=SEQ,
        lora=dict(r=2, target_modules="all-linear"),
        dtype=torch.bfloat16,
    )
    trainable = {n: p.dtype for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and set(trainable.values()) == {torch.float32}
    assert any("lora_" in n for n in trainable)
    frozen = {p.dtype for p in model.parameters() if not p.requires_grad}
    assert frozen == {torch.bfloat16}
    saved = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    assert {t.dtype for t in saved.values()} == {torch.float32}


def test_the_bf16_path_resumes_to_the_uninterrupted_run(toy, model_dir, tmp_path):
    """A bf16 base under bf16 autocast, padding-free, the LoRA fused: killed after its checkpoint at step 2 and
    resumed, the run logs the uninterrupted run's losses and ends on its float32 adapter weights."""
    import shutil

    from safetensors.torch import load_file

    catalogue, index = toy
    args = dict(max_steps=4, save_steps=2, logging_steps=1, bf16=True, padding_free=True, fused_lora=True)
    args |= dict(compile_blocks=False, optim="sgd", learning_rate=0.1, lr_scheduler_type="constant")

    def run(out, resume: bool = False) -> list[dict]:
        train_recommender(
            catalogue, index, _config(out, **args), model_path=model_dir, fmt=SEQ, lora=dict(r=2),
            dtype=torch.bfloat16, resume=resume,
        )  # fmt: skip
        return json.loads((out / "log_history.json").read_text())

    def steps(log: list[dict]) -> list[dict]:
        return [e for e in log if "loss" in e]

    whole = [e["loss"] for e in steps(run(tmp_path / "whole"))]
    first = load_file(str(tmp_path / "whole" / "adapter" / "adapter_model.safetensors"))
    cut = tmp_path / "cut"
    before = steps(run(cut))
    shutil.rmtree(cut / "checkpoint-4")
    shutil.rmtree(cut / "adapter")  # as if killed after the checkpoint at step 2
    resumed = run(cut, resume=True)
    after = steps(resumed)
    assert after[:2] == before[:2]  # steps 1-2 from the checkpoint, their clock too
    (summary,) = [e for e in resumed if "train_loss" in e]  # this process trained steps 3-4 only
    assert summary["train_loss"] == pytest.approx((after[2]["loss"] + after[3]["loss"]) / 2, rel=1e-6)
    assert len(whole) == 4 and [e["loss"] for e in after] == pytest.approx(whole, rel=1e-3)
    again = load_file(str(cut / "adapter" / "adapter_model.safetensors"))
    assert set(again) == set(first) and {t.dtype for t in again.values()} == {torch.float32}
    for name, weight in first.items():
        torch.testing.assert_close(again[name], weight, rtol=1e-3, atol=1e-5)


def test_cli_objective_minutes_and_dtype():
    from peft_grounded.cli import ground, sft
    from peft_grounded.training.stage_config import GroundingConfig

    _, _, args, _, config = sft.parse(
        ["--sid-index", "s", "--output_dir", "o", "--objective", "sequence", "--max_minutes", "15"]
    )
    assert args.prompt_format() == PromptFormat(objective="sequence", max_history=19)
    assert config.max_minutes == 15 and config.max_steps == -1  # the time alone ends the run
    assert isinstance(config, RecommendationConfig)
    _, _, plain_args, _, plain = sft.parse(["--sid-index", "s", "--output_dir", "o"])
    assert plain_args.prompt_format() == PromptFormat() and plain.max_steps == 400
    _, _, both_model, both = ground.parse(
        ["--sid-index", "s", "--output_dir", "o", "--max_minutes", "2", "--max_steps", "50"]
    )
    assert both.max_steps == 50 and both_model.dtype == "float32"
    assert plain.lr_scheduler_type == "cosine"  # the default
    _, _, _, linear = ground.parse(
        ["--sid-index", "s", "--output_dir", "o", "--max_steps", "50", "--lr_scheduler_type", "linear"]
    )
    assert isinstance(linear, GroundingConfig) and linear.lr_scheduler_type == "linear"


def test_a_timed_run_resumes_with_its_clock_and_counts(toy, model_dir, tmp_path):
    """Resuming a run with a time budget continues its training seconds and item count from the checkpoint."""
    import shutil

    catalogue, index = toy
    out = tmp_path / "resumed"
    args = dict(max_steps=4, save_steps=2, logging_steps=2, max_minutes=10)
    train_recommender(catalogue, index, _config(out, **args), model_path=model_dir, fmt=SEQ, lora=dict(r=2))
    whole = [e for e in json.loads((out / "log_history.json").read_text()) if "loss" in e]
    shutil.rmtree(out / "checkpoint-4")
    shutil.rmtree(out / "adapter")  # as if killed after the checkpoint at step 2
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    saved = state["stateful_callbacks"]["TrainingClock"]["attributes"]
    assert saved["items"] == whole[0]["items_seen"] and saved["seconds"] > 0
    train_recommender(
        catalogue, index, _config(out, **args), model_path=model_dir, fmt=SEQ, lora=dict(r=2), resume=True
    )
    resumed = [e for e in json.loads((out / "log_history.json").read_text()) if "loss" in e]
    assert [e["items_seen"] for e in resumed] == [e["items_seen"] for e in whole]
    assert resumed[-1]["seconds"] > saved["seconds"]


def test_compact_loss_equals_trls_head_on_sequence_rows(toy, model_dir, tmp_path):
    """The compact head (labelled positions only) gives TRL's loss on the sequence objective's masks."""
    from peft_grounded.adapter import add_lora
    from peft_grounded.sids.extended_base import RowStart, sid_model
    from peft_grounded.training.sft import RecommendationTrainer

    catalogue, index = toy
    tokenizer, model = sid_model(model_dir, index, start=RowStart(init="centroid"), fmt=SEQ)
    add_lora(model, r=2, target_modules="all-linear")
    data = training_dataset(catalogue.leave_one_out(), index, catalogue, tokenizer, SEQ)
    trainers = [
        RecommendationTrainer(
            model,
            _config(tmp_path / f"c{compact}", max_steps=1, compact_loss=compact),
            train_dataset=data,
            processing_class=tokenizer,
        )
        for compact in (True, False)
    ]
    batch = next(iter(trainers[0].get_train_dataloader()))
    assert ((batch["labels"] != -100).sum(-1) > 0).all()
    model.train()
    losses = [trainer.compute_loss(model, batch).item() for trainer in trainers]
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
