"""Grounding data and the grounding stage: only new rows move, checkpoints resume exactly, runs are checked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.toy_catalogue import toy_catalogue, toy_index

import peft_grounded
from peft_grounded.training.grounding import GroundingTrainer, grounding_dataset, grounding_examples
from peft_grounded.training.runs import RunMismatchError
from peft_grounded.training.stage_config import GroundingConfig

SCRIPT = Path(__file__).parent / "helpers" / "grounding_run.py"


@pytest.fixture(scope="module")
def toy():
    catalogue = toy_catalogue()
    return catalogue, toy_index(catalogue)


def test_six_templates_per_item_with_counted_skips(toy):
    catalogue, index = toy
    from peft_grounded.training.grounding import GroundingData

    data = GroundingData(fallback_description_fields=())
    rows = grounding_examples(catalogue, index, data)
    no_description = sum(1 for item in catalogue.items.values() if not item.description)
    assert len(rows) == 6 * len(catalogue) - 4 * no_description
    assert sum(data.skipped.values()) == 4 * no_description
    first = [r for r in rows if r["item_id"] == "0"]
    assert [r["template"] for r in first][:3] == [
        "title_to_sid",
        "description_to_sid",
        "title_description_to_sid",
    ]
    assert first[0]["completion"] == [{"role": "assistant", "content": index.sid_text("0")}]
    assert first[0]["prompt"][0] == {"role": "system", "content": "You are a helpful assistant."}
    reverse = next(r for r in first if r["template"] == "sid_to_title")
    assert index.sid_text("0") in reverse["prompt"][-1]["content"]
    assert reverse["completion"][0]["content"] == catalogue.items["0"].title
    # the fallback describes items without a description by their other fields
    rows = grounding_examples(catalogue, index)
    assert len(rows) == 6 * len(catalogue)


def test_plain_prompts_for_a_model_without_chat_template(toy, tokenizer):
    catalogue, index = toy
    tokenizer.chat_template = None
    dataset = grounding_dataset(catalogue, index, tokenizer)
    row = dataset[0]
    assert isinstance(row["prompt"], str) and row["prompt"].endswith("Answer:")
    assert row["completion"] == index.sid_text("0")  # directly after "Answer:", as in the SFT prompts


def ground(tokenizer, factory, toy, tmp_path, **config):
    catalogue, index = toy
    model = factory("llama", False)
    new = peft_grounded.add_tokens(tokenizer, model, index.token_strings)
    args = GroundingConfig(
        output_dir=str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=4,
        learning_rate=0.05,
        use_cpu=True,
        bf16=False,
        max_length=64,
        disable_tqdm=True,
        save_steps=1,
        **config,
    )
    dataset = grounding_dataset(catalogue, index, tokenizer)
    return GroundingTrainer(
        model,
        args,
        peft_config=peft_grounded.GroundedTokenConfig(token_indices=new),
        train_dataset=dataset,
        processing_class=tokenizer,
    )


def test_grounding_moves_only_new_rows_and_writes_artefacts(tokenizer, tiny_model_factory, toy, tmp_path):
    trainer = ground(tokenizer, tiny_model_factory, toy, tmp_path)
    base = trainer.model.get_base_model()
    frozen = {k: v.clone() for k, v in base.state_dict().items() if ".grounded_" not in k}
    layer = trainer.model.get_input_embeddings()
    before = (
        layer.grounded_embedding["default"].detach().clone(),
        layer.grounded_head["default"].detach().clone(),
    )
    trainer.train()
    assert not torch.equal(layer.grounded_embedding["default"], before[0])
    assert not torch.equal(layer.grounded_head["default"], before[1])
    after = base.state_dict()
    assert all(torch.equal(frozen[k], after[k]) for k in frozen)
    for name in (
        "run.json",
        "log_history.json",
        "adapter/adapter_model.safetensors",
        "checkpoint-2/run.json",
    ):
        assert (tmp_path / name).is_file(), name


def test_grounding_refuses_a_lora_or_a_trainable_backbone(tokenizer, tiny_model_factory, toy, tmp_path):
    catalogue, index = toy
    model = tiny_model_factory("llama", True)
    new = peft_grounded.add_tokens(tokenizer, model, index.token_strings)
    config = peft_grounded.GroundedTokenConfig(token_indices=new, lora={"r": 2, "target_modules": ["q_proj"]})
    with pytest.raises(ValueError, match="stack the LoRA"):
        GroundingTrainer(
            model,
            GroundingConfig(output_dir=str(tmp_path), use_cpu=True),
            peft_config=config,
            train_dataset=grounding_dataset(catalogue, index, tokenizer),
            processing_class=tokenizer,
        )


def test_resume_with_another_configuration_is_refused_and_keeps_checkpoints(
    tokenizer, tiny_model_factory, toy, tmp_path
):
    ground(tokenizer, tiny_model_factory, toy, tmp_path).train()
    kept = sorted(p.name for p in tmp_path.iterdir())
    other = ground(peft_tokenizer(tokenizer), tiny_model_factory, toy, tmp_path, seed=7)
    with pytest.raises(RunMismatchError, match="seed: 0 -> 7"):
        other.train(resume_from_checkpoint=True)
    with pytest.raises(RunMismatchError, match="another run"):
        other.train()  # a fresh run into a directory with another run's checkpoints
    assert sorted(p.name for p in tmp_path.iterdir()) == kept


def peft_tokenizer(tokenizer):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer.name_or_path)


def run(*args):
    result = subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=600
    )
    return result


def test_killed_run_resumes_to_the_same_state(tmp_path):
    straight = run(tmp_path / "straight", "--max-steps", 6)
    assert straight.returncode == 0, straight.stderr[-3000:]
    crashed = run(tmp_path / "crashed", "--max-steps", 6, "--kill-at", 4)
    assert crashed.returncode == -9, crashed.stderr[-3000:]  # SIGKILL
    assert (tmp_path / "crashed" / "checkpoint-4").is_dir() and not (
        tmp_path / "crashed" / "final_rows.pt"
    ).exists()
    resumed = run(tmp_path / "crashed", "--max-steps", 6, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    expected = torch.load(tmp_path / "straight" / "final_rows.pt")
    got = torch.load(tmp_path / "crashed" / "final_rows.pt")
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-5, atol=1e-6)
    start = torch.load(tmp_path / "straight" / "final_rows.pt")["input"]
    assert start.abs().sum() > 0


def test_check_run_reads_only(tmp_path):
    """What every rank of a distributed run calls before training: it refuses, and never writes."""
    from peft_grounded.training import runs

    runs.write_json_atomic(tmp_path / runs.MANIFEST, {"seed": 1})
    (tmp_path / "checkpoint-2").mkdir()
    runs.write_json_atomic(tmp_path / "checkpoint-2" / runs.MANIFEST, {"seed": 1})
    before = sorted(p.name for p in tmp_path.rglob("*"))
    runs.check_run(tmp_path, {"seed": 1}, tmp_path / "checkpoint-2")
    with pytest.raises(RunMismatchError, match="seed: 1 -> 2"):
        runs.check_run(tmp_path, {"seed": 2}, tmp_path / "checkpoint-2")
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
    assert json.loads((tmp_path / runs.MANIFEST).read_text()) == {"seed": 1}


def test_compact_loss_reaches_the_model_with_or_without_a_task_type(
    tokenizer, tiny_model_factory, toy, tmp_path, monkeypatch
):
    """The trainer installs the compact head on the causal LM itself, so a plain PeftModel (no task_type)
    and a PeftModelForCausalLM both take it: one call per training step."""
    import peft_grounded.sid_head as compact

    calls = []
    original = compact.compact_fused_forward

    def spy(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(compact, "compact_fused_forward", spy)
    catalogue, index = toy
    for task_type in (None, "CAUSAL_LM"):
        calls.clear()
        model = tiny_model_factory("llama", False)
        extended = peft_tokenizer(tokenizer)
        new = peft_grounded.add_tokens(extended, model, index.token_strings)
        args = GroundingConfig(
            output_dir=str(tmp_path / str(task_type)),
            max_steps=1,
            per_device_train_batch_size=2,
            use_cpu=True,
            max_length=64,
            disable_tqdm=True,
            save_strategy="no",
        )
        trainer = GroundingTrainer(
            model,
            args,
            peft_config=peft_grounded.GroundedTokenConfig(token_indices=new, task_type=task_type),
            train_dataset=grounding_dataset(catalogue, index, extended),
            processing_class=extended,
        )
        own = trainer.model.get_base_model().__dict__.get("forward")
        trainer.train()
        assert len(calls) == 1, task_type
        assert trainer.model.get_base_model().__dict__.get("forward") is own  # restored after each step
