"""Shared fixtures: a real tokenizer (SmolLM2's BPE, from the local GGUF) and tiny models built from configs."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch

from peft_grounded import assets

ARCHES = ("llama", "qwen3")


@pytest.fixture(scope="session")
def smollm2_dir():
    return assets.smollm2()


@pytest.fixture
def tokenizer(smollm2_dir):
    """A fresh copy of the SmolLM2 tokenizer (tests add tokens to it)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


def build_tiny_model(
    arch: str = "llama",
    tied: bool = True,
    vocab_size: int = 49152,
    extra_rows: int = 0,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
):
    """A 2-layer, 64-wide causal LM with the tokenizer's vocabulary.

    ``extra_rows`` pads the embedding matrix beyond the tokenizer like Qwen3 checkpoints do.
    """
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    common = dict(
        vocab_size=vocab_size + extra_rows,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=tied,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    config = LlamaConfig(**common) if arch == "llama" else Qwen3Config(head_dim=16, **common)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).to(dtype)
    model.eval()
    return model


@pytest.fixture
def tiny_model_factory():
    return build_tiny_model


@pytest.fixture
def save_tiny_model(tiny_model_factory, tokenizer):
    """``save(path, tied=True)``: a tiny llama and the tokenizer saved as a local model directory (what
    --model_name_or_path and model_path take); returns the path as a string."""

    def save(path, tied: bool = True) -> str:
        tiny_model_factory("llama", tied).save_pretrained(path)
        tokenizer.save_pretrained(path)
        return str(path)

    return save


@pytest.fixture
def model_dir(tmp_path, save_tiny_model):
    """A saved tiny model directory (tied head) with the real tokenizer."""
    return save_tiny_model(tmp_path / "base")


# Loopback Hugging Face Hub for push/pull tests (hub_server, hub_endpoint, hub_env): see tests/helpers/hub_fixtures.py.
from helpers.hub_fixtures import hub_endpoint, hub_env, hub_server  # noqa: E402, F401

# A folder another user can reach, for the tests that run a child as another uid: see tests/helpers/robust_faults.py.
from helpers.robust_faults import public_tmp  # noqa: E402, F401
