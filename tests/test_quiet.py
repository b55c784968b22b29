"""Notices the package's own calls caused and its user could do nothing about are not printed: transformers'
FutureWarnings about ``gradient_checkpointing`` (the training settings) and ``is_gradient_checkpointing`` (PEFT
wrapping a base the package loaded), and DeepSpeed's "Setting accelerator to CPU" (accelerate importing it to
unwrap a model the package saves). Warnings the user's own code causes still show."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import warnings

import pytest
import torch
from helpers.toy_catalogue import toy_catalogue, toy_index

from peft_grounded.sids.extended_base import sid_model
from peft_grounded.training.sft import RecommendationConfig
from peft_grounded.training.stage_config import GroundingConfig


def _caught(fn, *args, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn(*args, **kwargs)
    return result, [f"{w.category.__name__}: {w.message}" for w in caught]


def _checkpointing(messages: list[str]) -> list[str]:
    return [m for m in messages if "checkpointing" in m]


def test_the_training_settings_warn_of_no_deprecated_checkpointing_alias(tmp_path):
    for config in (GroundingConfig, RecommendationConfig):
        made, messages = _caught(config, output_dir=str(tmp_path), use_cpu=True)
        assert _checkpointing(messages) == [], config.__name__
        assert made.activation_checkpointing is False and made.gradient_checkpointing is False
    # the old flag still works (transformers then warns, rightly: the user wrote the deprecated name)
    from peft_grounded.cli import sft

    with pytest.warns(FutureWarning, match="`gradient_checkpointing` is deprecated"):
        *_, config = sft.parse(["--sid-index", "s", "--gradient_checkpointing"])
    assert config.activation_checkpointing is True
    *_, config = sft.parse(["--sid-index", "s", "--activation_checkpointing"])
    assert config.activation_checkpointing is True


def test_loading_through_the_package_warns_of_no_deprecated_checkpointing(model_dir, tmp_path):
    index = toy_index(toy_catalogue())
    (_, model), messages = _caught(sid_model, str(model_dir), index)  # get_peft_model
    assert _checkpointing(messages) == []
    model.save_pretrained(tmp_path / "adapter")
    (_, loaded), messages = _caught(sid_model, str(model_dir), index, adapter=str(tmp_path / "adapter"))
    assert _checkpointing(messages) == []  # PeftModel.from_pretrained
    # the user's own read of the deprecated name still warns: only the package's calls are quiet
    _, messages = _caught(lambda: loaded.get_base_model().is_gradient_checkpointing)
    assert any("is_gradient_checkpointing" in m for m in messages)


CHILD = """
import logging
import sys

import peft_grounded
from peft_grounded.training.sft.recommendation_trainer import shallow_base

shallow_base(sys.argv[1], 1, sys.argv[2])  # loads and saves the base: accelerate imports DeepSpeed to unwrap it
assert "deepspeed" in sys.modules
print("--- control", flush=True)
from deepspeed.accelerator import real_accelerator

logging.getLogger("DeepSpeed").filters.clear()
real_accelerator.ds_accelerator = None
real_accelerator.get_accelerator()
"""


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed is not installed")
def test_deepspeed_s_cpu_notice_is_not_printed(model_dir, tmp_path):
    """A fresh process (DeepSpeed logs the notice once per process): the package's save imports DeepSpeed
    without the notice; the control, the detection run again without the filter, prints it."""
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(model_dir), str(tmp_path / "cut")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    before, _, control = result.stdout.partition("--- control")  # DeepSpeed logs to stdout
    assert "Setting accelerator to CPU" not in before + result.stderr
    if not torch.cuda.is_available():  # with a GPU DeepSpeed finds it and says nothing either way
        assert "Setting accelerator to CPU" in control
