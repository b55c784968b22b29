"""Full fine-tuning of the base's decoder blocks (the recipe table's reference row): what trains, at which rate,
and that such a run is refused where it cannot resume."""

from __future__ import annotations

import shutil

import pytest
import torch
from helpers.toy_catalogue import toy_catalogue, toy_index
from transformers import TrainerCallback

from peft_grounded.evaluation import EvalSettings
from peft_grounded.pipeline import Budget, Experiment, run_strategy
from peft_grounded.pipeline.runner import BlockLearningRate, decoder_blocks, unfreeze_blocks
from peft_grounded.prompts import PromptFormat
from peft_grounded.sids.extended_base import RowStart, sid_model
from peft_grounded.training.runs import RunMismatchError
from peft_grounded.training.sft import RecommendationConfig
from peft_grounded.training.sft.recommendation_trainer import train_recommender


class _Rates(TrainerCallback):
    """Every step's learning rate of each optimizer group."""

    def __init__(self) -> None:
        self.rates: list[list[float]] = []

    def on_step_end(self, args, state, control, optimizer=None, **kwargs):
        self.rates.append([g["lr"] for g in optimizer.param_groups if g["params"]])


@pytest.fixture(scope="module")
def toy():
    catalogue = toy_catalogue()
    return catalogue, toy_index(catalogue)


@pytest.mark.parametrize(("arch", "tied"), [("llama", True), ("qwen3", False)])
def test_blocks_train_at_their_own_rate_and_nothing_else_moves(
    toy, tiny_model_factory, tokenizer, tmp_path, arch, tied
):
    catalogue, index = toy
    model_dir = str(tmp_path / "base")
    tiny_model_factory(arch, tied).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    fmt = PromptFormat(objective="sequence", max_history=4)
    tokenizer, model = sid_model(model_dir, index, start=RowStart(init="centroid"), fmt=fmt)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    blocks = unfreeze_blocks(model)
    assert blocks and all(p.requires_grad for p in decoder_blocks(model).parameters())
    rates = _Rates()
    args = RecommendationConfig(
        output_dir=str(tmp_path / "sft"),
        max_steps=3,
        learning_rate=1e-2,
        per_device_train_batch_size=4,
        logging_steps=1,
        save_steps=10,
        disable_tqdm=True,
        report_to=[],
    )
    train_recommender(
        catalogue,
        index,
        args,
        lora=False,
        fmt=fmt,
        model=model,
        tokenizer=tokenizer,
        callbacks=[BlockLearningRate(blocks, 1e-4), rates],
    )
    names = [n for n, _ in model.named_parameters()]
    assert not any("lora_" in n for n in names)  # no LoRA stacked
    block_ids = {id(p) for p in blocks}
    moved = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])}
    in_blocks = {n for n, p in model.named_parameters() if id(p) in block_ids}
    rows = {n for n in moved if n not in in_blocks}
    assert in_blocks & moved, "the blocks did not train"
    assert rows and all("grounded" in n for n in rows), rows  # outside the blocks only the new rows moved
    assert len(rates.rates) == 3
    for step in rates.rates:  # two groups, the blocks' at 1/100 of the rows', on one schedule
        assert len(step) == 2 and step[1] == pytest.approx(step[0] * 1e-2, rel=1e-6)
    assert rates.rates[-1][0] < rates.rates[0][0]  # the schedule decays both


def test_runner_fine_tunes_the_blocks_and_refuses_to_resume_them(toy, model_dir, tmp_path):
    catalogue, index = toy
    budget = Budget.from_training(
        dict(per_device_train_batch_size=2, save_steps=1, logging_steps=1, disable_tqdm=True),
        grounding=False,
        sft=dict(max_steps=2),
        lora=dict(r=2),
        evaluation=EvalSettings(users=2, num_beams=5, ks=(1, 5)),
        eval_parts=("test",),
        block_lr=1e-4,
    )
    assert budget.record()["block_lr"] == 1e-4 and Budget().record()["block_lr"] is None
    experiment = Experiment(model_dir, catalogue, index)
    out = tmp_path / "run"
    record = run_strategy("centroid", experiment, budget, out)
    assert record["metrics"]["test"]["decoding"]["invalid"] == 0
    assert (out / "sft" / "adapter" / "adapter_model.safetensors").is_file()
    # interrupted before its results were written: the blocks' weights are gone, so it is refused
    (out / "metrics.json").unlink()
    with pytest.raises(RunMismatchError, match="does not resume"):
        run_strategy("centroid", experiment, budget, out, resume=True)
    shutil.rmtree(out / "sft")
    again = run_strategy("centroid", experiment, budget, out, resume=True)  # SFT from the saved start
    assert again["metrics"]["test"]["all"]["users"] == 2


def test_block_lr_is_checked():
    with pytest.raises(ValueError, match="block_lr"):
        Budget(block_lr=0.0)
    with pytest.raises(ValueError, match="cannot keep the best"):
        Budget(block_lr=1e-4, keep_best=True, eval_every=5)
    with pytest.raises(ValueError, match="needs the parameters"):
        BlockLearningRate([], 1e-4)
