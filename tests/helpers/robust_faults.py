"""What the adversarial tests (tests/test_robust_checkpoints, _data_loss, _locks, _peft, _writes) share: a tiny grounding run as a function, and a
world on disk for the commands (a tiny base model folder, the toy catalogue in the LC-Rec format, its SID
index)."""

from __future__ import annotations

import copy
import functools
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from conftest import build_tiny_model
from safetensors.torch import load_file

from helpers.toy_catalogue import toy_catalogue, toy_index

WEIGHTS = "adapter_model.safetensors"
NOBODY = 65534  # the uid the tests of other users' permissions run as
as_another_user = pytest.mark.skipif(
    os.geteuid() != 0,
    reason="runs a child as another user (setuid needs root); root ignores permissions itself",
)


@pytest.fixture
def public_tmp():
    """A folder another user can reach (pytest's own tmp_path is private to root)."""
    folder = Path(tempfile.mkdtemp(prefix="robust-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@functools.cache
def _smollm2_tokenizer():
    from transformers import AutoTokenizer

    from peft_grounded import assets

    return AutoTokenizer.from_pretrained(assets.smollm2())


def fresh_tokenizer():
    """A copy of the SmolLM2 tokenizer (read from disk once per process: its JSON takes a second)."""
    return copy.deepcopy(_smollm2_tokenizer())


def grounding_trainer(output_dir, *, max_steps: int = 6, save_steps: int = 2, seed: int = 0, callbacks=()):
    """A tiny untied model's grounding run (the toy catalogue, batch 4): a few seconds end to end."""
    import peft_grounded
    from peft_grounded.training.grounding import GroundingTrainer, grounding_dataset
    from peft_grounded.training.stage_config import GroundingConfig

    torch.manual_seed(0)
    tokenizer = fresh_tokenizer()
    catalogue = toy_catalogue()
    index = toy_index(catalogue)
    model = build_tiny_model("llama", False)
    new = peft_grounded.add_tokens(tokenizer, model, index.token_strings)
    config = GroundingConfig(
        output_dir=str(output_dir),
        max_steps=max_steps,
        per_device_train_batch_size=4,
        learning_rate=0.05,
        save_steps=save_steps,
        logging_steps=1,
        use_cpu=True,
        bf16=False,
        max_length=64,
        disable_tqdm=True,
        seed=seed,
        dataloader_num_workers=0,
    )
    return GroundingTrainer(
        model,
        config,
        peft_config=peft_grounded.GroundedTokenConfig(token_indices=new),
        train_dataset=grounding_dataset(catalogue, index, tokenizer),
        processing_class=tokenizer,
        callbacks=list(callbacks),
    )


def train(output_dir, resume: bool = False, **kwargs):
    """Run (or resume) the tiny grounding run; returns the trainer."""
    trainer = grounding_trainer(output_dir, **kwargs)
    trainer.train(resume_from_checkpoint=True if resume else None)
    return trainer


def rows(output_dir) -> dict[str, torch.Tensor]:
    """The final adapter's weights."""
    return load_file(str(Path(output_dir) / "adapter" / WEIGHTS))


def assert_same_rows(got: dict, expected: dict) -> None:
    assert got.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-5, atol=1e-6)


def logged_steps(output_dir) -> list[int]:
    history = json.loads((Path(output_dir) / "log_history.json").read_text())
    return [e["step"] for e in history if "loss" in e]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes (what 'nothing changed' compares)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def make_world(root: Path, tokenizer) -> dict:
    """A tiny base model folder, the toy catalogue as LC-Rec files and its SID index, under ``root``."""
    catalogue = toy_catalogue()
    toy_index(catalogue).save(root / "sids")
    base = root / "base"
    build_tiny_model("llama", False).save_pretrained(base)
    tokenizer.save_pretrained(base)
    items = {
        i: {"title": it.title, "description": it.description, "categories": ", ".join(it.categories)}
        for i, it in catalogue.items.items()
    }
    (root / "toy.item.json").write_text(json.dumps(items))
    (root / "toy.inter.json").write_text(json.dumps({u: list(s) for u, s in catalogue.sequences.items()}))
    data = [
        "--model_name_or_path",
        str(base),
        "--sid-index",
        str(root / "sids"),
        "--catalogue",
        str(root / "toy"),
    ]
    return {"root": root, "base": str(base), "data": data}


TINY = ["--per_device_train_batch_size", "4", "--save-steps", "2", "--max-length", "96"]


def ground_args(world: dict, output, steps: int = 4, *extra: str) -> list[str]:
    """``peft-grounded ground`` on the world, ``steps`` steps into ``output``."""
    return ["ground", *world["data"], *TINY, "--max_steps", str(steps), "--output_dir", str(output), *extra]
