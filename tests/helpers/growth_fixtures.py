"""A toy parent SID index and its grown child, and an adapter trained on the parent, for the growth tests."""

from __future__ import annotations

import numpy as np
import torch
from peft import get_peft_model

import peft_grounded
from helpers.toy_catalogue import toy_catalogue, toy_index, toy_vectors
from peft_grounded import GroundedTokenConfig
from peft_grounded.cli import main
from peft_grounded.new_items import add_items, grow_adapter
from peft_grounded.sids import Item
from peft_grounded.sids.extended_base import record_sid_facts, save_sid_record


def grown_indices():
    """A toy parent index and a child with 3 new items (the last level grows)."""
    catalogue = toy_catalogue()
    parent = toy_index(catalogue)
    x = toy_vectors(catalogue)
    # 3 new items: two copies of item 0's vector (they join its SID group, so the last level grows) + one more
    new = np.stack([x[0], x[0] + 1e-3, x[5] + 0.5])
    child = add_items(parent, [Item(f"new{i}", title=f"New {i}") for i in range(3)], vectors=new)
    assert child.n_tokens > parent.n_tokens
    return parent, child


def trained(tokenizer, factory, parent, arch, tied, lora, dtype=torch.float32):
    base = factory(arch, tied, dtype=dtype)
    tokens, centroids = parent.adapter_init()
    ids = peft_grounded.add_tokens(tokenizer, base, tokens)
    config = GroundedTokenConfig(
        token_indices=ids,
        init="centroid",
        init_vectors=centroids,
    )
    model = get_peft_model(base, config)
    record_sid_facts(model, sid_index_fingerprint=parent.fingerprint())
    if lora:
        peft_grounded.add_lora(model, r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"])
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # "training": move every trainable weight off its init
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.1 * torch.randn(p.shape, generator=generator))
    return model.eval()


def saved_adapter(root, tokenizer, tiny_model_factory, parent, lora: bool):
    """A tiny Llama base (untied head) saved in ``root/base`` and an adapter "trained" on ``parent`` saved with
    its SID record in ``root/adapter``, recording that base; returns the model and the base's folder."""
    base = root / "base"
    tiny_model_factory("llama", False).save_pretrained(base)
    tokenizer.save_pretrained(base)
    model = trained(tokenizer, tiny_model_factory, parent, "llama", False, lora)
    model.peft_config["default"].base_model_name_or_path = str(base)
    model.save_pretrained(root / "adapter")
    save_sid_record(model, root / "adapter")
    return model, base


def grow_world(tmp_path, tokenizer, tiny_model_factory):
    """A saved tiny base, parent and child indices, an adapter "trained" on the parent (untied head, LoRA)
    that records the base's directory, and the in-process grown adapter (saved) to compare with."""
    parent, child = grown_indices()
    parent.save(tmp_path / "sids")
    child.save(tmp_path / "sids-v2")
    model, base = saved_adapter(tmp_path, tokenizer, tiny_model_factory, parent, lora=True)
    reference = grow_adapter(model, tokenizer, parent, child)
    reference.save_pretrained(tmp_path / "reference")
    save_sid_record(reference, tmp_path / "reference")
    return {"root": tmp_path, "parent": parent, "child": child, "base": str(base)}


def grow(world, output: str, *extra: str, child: str = "sids-v2") -> int:
    root = world["root"]
    return main(
        [
            "grow-adapter",
            "--adapter",
            str(root / "adapter"),
            "--parent-index",
            str(root / "sids"),
            "--sid-index",
            str(root / child),
            "--output_dir",
            str(root / output),
            *extra,
        ]
    )
