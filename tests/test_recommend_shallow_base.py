"""A shallower base keeps the first decoder blocks and everything around them, as a model of its own."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from peft_grounded.training.sft.recommendation_trainer import shallow_base


def test_the_first_blocks_are_kept_bit_for_bit_and_the_model_runs(tmp_path, save_tiny_model):
    full_dir = save_tiny_model(tmp_path / "full", tied=True)
    full = AutoModelForCausalLM.from_pretrained(full_dir)
    total = full.config.num_hidden_layers
    assert total >= 2
    out = shallow_base(full_dir, 1, tmp_path / "shallow")
    shallow = AutoModelForCausalLM.from_pretrained(out, use_safetensors=True)
    assert shallow.config.num_hidden_layers == 1 and len(shallow.model.layers) == 1
    kept = shallow.state_dict()
    for name, tensor in full.state_dict().items():
        if ".layers." in name and not name.split(".layers.")[1].startswith("0."):
            assert name not in kept
        else:
            assert torch.equal(kept[name], tensor), name
    with torch.no_grad():
        logits = shallow(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape[-1] == full.config.vocab_size and torch.isfinite(logits).all()
    assert shallow_base(full_dir, 1, out) == out  # made once; a second call reuses it


def test_bad_depths_and_a_folder_of_another_depth_are_refused(tmp_path, save_tiny_model):
    full_dir = save_tiny_model(tmp_path / "full", tied=True)
    total = AutoModelForCausalLM.from_pretrained(full_dir).config.num_hidden_layers
    for layers in (0, total + 1):
        with pytest.raises(ValueError, match="decoder blocks"):
            shallow_base(full_dir, layers, tmp_path / f"bad-{layers}")
        assert not (tmp_path / f"bad-{layers}").exists()
    shallow_base(full_dir, 1, tmp_path / "one")
    with pytest.raises(ValueError, match="another directory"):
        shallow_base(full_dir, 2, tmp_path / "one")
