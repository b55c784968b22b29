"""The same seed gives the same figures in one process (issue 61, part 1): every random start of an ``sft`` run
(the rows, the stacked LoRA, the data order, LoRA dropout, augmentation, NEFTune's noise, the SASRec teacher)
follows the run's ``seed``, not the process's generators, and the caller's generators are left as they were."""

from __future__ import annotations

import json
import random

import pytest
import torch
from helpers.toy_catalogue import toy_catalogue, toy_index
from safetensors.torch import load_file

from peft_grounded.prompts import PromptFormat
from peft_grounded.sids.extended_base import RowStart
from peft_grounded.training.sft import RecommendationConfig, train_recommender

SEQ = PromptFormat(objective="sequence", max_history=3)


@pytest.fixture(scope="module")
def toy():
    catalogue = toy_catalogue()
    return catalogue, toy_index(catalogue)


def _train(toy, model_dir, out, seed: int) -> tuple[list[dict], dict[str, torch.Tensor], bytes]:
    """A 4-step run with every random start on: gaussian rows, a LoRA with dropout, augmented copies, NEFTune
    and a distillation teacher fitted now. Returns its loss log, adapter tensors and teacher targets."""
    catalogue, index = toy
    config = RecommendationConfig(
        output_dir=str(out), per_device_train_batch_size=4, max_steps=4, learning_rate=0.05, logging_steps=1,
        save_steps=1000, use_cpu=True, report_to="none", disable_tqdm=True, max_length=64, seed=seed,
        augment_views=1, augment_drop=0.3, neftune_noise_alpha=5.0, distill_weight=0.5, distill_epochs=2,
        distill_top_k=4,
    )  # fmt: skip
    train_recommender(
        catalogue,
        index,
        config,
        model_path=model_dir,
        start=RowStart(init="gaussian"),
        fmt=SEQ,
        lora=dict(r=2, lora_dropout=0.3, target_modules="all-linear"),
    )
    log = json.loads((out / "log_history.json").read_text())
    steps = [{k: v for k, v in e.items() if k not in ("seconds", "train_runtime") and "per_second" not in k}
             for e in log]  # fmt: skip
    tensors = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    return steps, tensors, (out / "teacher" / "targets.safetensors").read_bytes()


def _disturb() -> None:
    """Move every generator of the process, as other work between two runs would."""
    torch.manual_seed(123)
    torch.rand(7)
    random.seed(5)
    random.random()


def test_one_seed_gives_the_same_figures_twice_in_one_process(toy, model_dir, tmp_path, monkeypatch):
    runs = []
    for n in range(2):
        # the teacher is fitted each time, not read from the first run's cache
        monkeypatch.setenv("PEFT_GROUNDED_CACHE", str(tmp_path / f"cache{n}"))
        if n:
            _disturb()
        runs.append(_train(toy, model_dir, tmp_path / f"run{n}", seed=3))
    (log, tensors, targets), (log2, tensors2, targets2) = runs
    assert any("lora_A" in name for name in tensors) and sum("loss" in e for e in log) == 4
    assert log == log2  # every logged loss (and distill_loss, grad norm, item NLL) to the last bit
    assert targets == targets2
    assert tensors.keys() == tensors2.keys()
    for name, tensor in tensors.items():
        assert torch.equal(tensor, tensors2[name]), name
    # another seed, other figures: the comparison above can fail
    monkeypatch.setenv("PEFT_GROUNDED_CACHE", str(tmp_path / "cache-other"))
    other, other_tensors, _ = _train(toy, model_dir, tmp_path / "other", seed=4)
    assert [e["loss"] for e in other if "loss" in e] != [e["loss"] for e in log if "loss" in e]
    assert any(not torch.equal(t, other_tensors[n]) for n, t in tensors.items() if "lora_A" in n)


def test_the_lora_start_follows_the_seed_and_leaves_the_callers_generator(toy, model_dir, tmp_path):
    """The LoRA is drawn before the Trainer seeds the process: it is drawn from the run's seed, and the caller's
    generator is not moved by that draw."""
    from peft_grounded.training.trainer import seeded

    torch.manual_seed(11)
    state = torch.random.get_rng_state()
    with seeded(3):
        a = torch.rand(4)
    assert torch.equal(torch.random.get_rng_state(), state)
    torch.rand(9)
    with seeded(3):
        assert torch.equal(torch.rand(4), a)
