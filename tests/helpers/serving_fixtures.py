"""A served world on disk: a tiny base, a toy SID index, an adapter "trained" on it (LoRA, untied head)
that records the base's folder and carries its index in ``sid_index/``, and the same adapter grown onto a
child index with three new items."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from conftest import build_tiny_model

import peft_grounded
from helpers.growth_fixtures import grown_indices, saved_adapter
from helpers.toy_catalogue import toy_catalogue, toy_index
from peft_grounded import GroundedTokenConfig
from peft_grounded.new_items import grow_adapter
from peft_grounded.sids.extended_base import save_sid_record
from peft_grounded.training.sft.recommendation_trainer import record_sid_softmax


def serving_world(root: Path, tokenizer, tiny_model_factory) -> dict:
    parent, child = grown_indices()
    model, base = saved_adapter(root, tokenizer, tiny_model_factory, parent, lora=True)
    parent.save(root / "adapter" / "sid_index")
    parent.save(root / "sids")
    grown = grow_adapter(model, tokenizer, parent, child)
    grown.peft_config["default"].base_model_name_or_path = str(base)
    grown.save_pretrained(root / "grown")
    save_sid_record(grown, root / "grown")
    child.save(root / "grown" / "sid_index")
    child.save(root / "sids-v2")
    return {"root": root, "parent": parent, "child": child, "base": str(base)}


def write_histories(path: Path, histories: dict[str, list[str]]) -> Path:
    path.write_text("".join(json.dumps({"user": u, "history": h}) + "\n" for u, h in histories.items()))
    return path


def toy_adapter(root: Path, arch: str, tied: bool, sid_softmax: bool):
    """A saved tiny base, and a grounded adapter with a LoRA "trained" on the toy index (every trainable
    weight moved off its start), recording whether it trained under the SID-only softmax."""
    from peft import get_peft_model
    from transformers import AutoTokenizer

    catalogue = toy_catalogue()
    index = toy_index(catalogue)
    tokenizer = AutoTokenizer.from_pretrained(peft_grounded.assets.smollm2())
    base_dir = root / "base"
    build_tiny_model(arch, tied).save_pretrained(base_dir)
    tokenizer.save_pretrained(base_dir)
    base = build_tiny_model(arch, tied)
    tokens, centroids = index.adapter_init()
    ids = peft_grounded.add_tokens(tokenizer, base, tokens)
    config = GroundedTokenConfig(
        token_indices=ids,
        init="centroid",
        init_vectors=centroids,
    )
    model = get_peft_model(base, config)
    peft_grounded.add_lora(model, r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"])
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.5 * torch.randn(p.shape, generator=generator))
    record_sid_softmax(model, sid_softmax)
    model.peft_config["default"].base_model_name_or_path = str(base_dir)
    model.save_pretrained(root / "adapter")
    save_sid_record(model, root / "adapter")
    index.save(root / "adapter" / "sid_index")
    return catalogue, index, root / "adapter"
