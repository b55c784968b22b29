"""A served world on disk: a tiny base, a toy SID index, an adapter "trained" on it (LoRA, untied head)
that records the base's folder and carries its index in ``sid_index/``, and the same adapter grown onto a
child index with three new items."""

from __future__ import annotations

import json
from pathlib import Path

from helpers.growth_fixtures import grown_indices, saved_adapter
from peft_grounded.growth import grow_adapter
from peft_grounded.sids.model import save_sid_record


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
