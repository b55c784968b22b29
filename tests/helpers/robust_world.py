"""What the adversarial tests (tests/test_robust_inputs_*.py) share: a user's folder of real files (a tiny
base model, a toy catalogue in the LC-Rec layout, a SID index, an untrained adapter with a LoRA), a way to
run the CLI in-process, and a snapshot to show that a refused command changed none of the user's files."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from conftest import build_tiny_model

from helpers.toy_catalogue import toy_catalogue, toy_index
from peft_grounded.cli import main
from peft_grounded.sids.extended_base import save_sid_record


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """``peft-grounded ARGV`` in this process: ``(exit code, stdout, stderr)``; a traceback fails the test."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    return code, out, err


def refused(capsys, *argv: str) -> str:
    """Run a command that must be refused: exit code 2, one ``error: ...`` line; returns that line."""
    code, out, err = run_cli(capsys, *argv)
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2 and lines, (code, out, err)
    if os.environ.get("SHOW_REFUSALS"):  # a reviewer's view of every message
        print(lines[-1], file=sys.__stderr__)
    return lines[-1]


def snapshot(root: Path) -> dict[str, str]:
    """Every file and link under ``root``: its content's hash (a link: its target), to compare before/after."""
    state = {}
    for path in sorted(root.rglob("*")):
        key = str(path.relative_to(root))
        if path.is_symlink():
            state[key] = "link:" + os.readlink(path)
        elif path.is_file():
            state[key] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            state[key] = "dir"
    return state


def write_lcrec(directory: Path, items: dict, sequences: dict, name: str = "toy") -> Path:
    """A catalogue in the LC-Rec layout (``name.item.json`` + ``name.inter.json``); returns the prefix."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.item.json").write_text(json.dumps(items))
    (directory / f"{name}.inter.json").write_text(json.dumps(sequences))
    return directory / name


def toy_items() -> dict:
    return {
        i: {"title": it.title, "description": it.description, "categories": ", ".join(it.categories)}
        for i, it in toy_catalogue().items.items()
    }


@pytest.fixture(scope="module")
def world(tmp_path_factory, smollm2_dir):
    """A user's folder: ``base`` (tiny llama + the SmolLM2 tokenizer), ``toy`` (LC-Rec catalogue), ``sids``
    (its SID index), ``adapter`` (a grounded adapter with a LoRA, untrained, recording ``base``)."""
    from transformers import AutoTokenizer

    from peft_grounded.adapter import add_lora
    from peft_grounded.sids.extended_base import RowStart, sid_model

    root = tmp_path_factory.mktemp("user")
    base = root / "base"
    build_tiny_model("llama", False).save_pretrained(base)
    AutoTokenizer.from_pretrained(smollm2_dir).save_pretrained(base)
    catalogue = toy_catalogue()
    index = toy_index(catalogue)
    index.save(root / "sids")
    write_lcrec(root, toy_items(), {u: list(s) for u, s in catalogue.sequences.items()})
    _, model = sid_model(str(base), index, start=RowStart(init="centroid"))
    add_lora(model, r=2, lora_alpha=4, target_modules=["q_proj"])
    model.save_pretrained(root / "adapter")
    save_sid_record(model, root / "adapter")
    return {
        "root": root,
        "base": base,
        "sids": root / "sids",
        "catalogue": root / "toy",
        "adapter": root / "adapter",
    }


def data_args(world) -> list[str]:
    return [
        "--model_name_or_path",
        world["base"],
        "--sid-index",
        world["sids"],
        "--catalogue",
        world["catalogue"],
    ]


def build_sids_args(world, catalogue, out, *extra) -> list:
    """``build-sids`` of ``catalogue`` with the tiny base as its encoder (mean hidden states), 2 x 4 codes."""
    encoder = f"lm:{world['base']}"
    return [
        "build-sids",
        "--catalogue",
        catalogue,
        "--encoder",
        encoder,
        "--codes",
        "4",
        "--levels",
        "2",
        "--no-progress",
        "--output_dir",
        out,
        *extra,
    ]


def copy_adapter(world, tmp_path: Path, name: str = "adapter") -> Path:
    """A copy of the world's adapter to damage (the world's own stays intact for the other tests)."""
    target = tmp_path / name
    shutil.copytree(world["adapter"], target)
    return target
