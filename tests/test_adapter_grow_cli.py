"""``peft-grounded grow-adapter``: the CLI's grown adapter equals the in-process one, --ground moves only the
new items' rows, and bad outputs or indices are refused with exit code 2."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.growth_fixtures import grow, grow_world
from helpers.toy_catalogue import toy_catalogue, toy_index
from safetensors.torch import load_file

from peft_grounded.growth.grounding import rows_used
from peft_grounded.sids.model import sid_model, sid_record

WEIGHTS = "adapter_model.safetensors"


@pytest.fixture
def world(tmp_path, tokenizer, tiny_model_factory):
    """The grow-adapter world (see growth_fixtures.grow_world)."""
    return grow_world(tmp_path, tokenizer, tiny_model_factory)


def write_catalogue(world) -> str:
    """The old and the new items' text, in the LC-Rec format the CLI reads (replay needs the old items)."""
    items = {
        i: {"title": it.title, "description": it.description, "categories": ", ".join(it.categories)}
        for i, it in toy_catalogue().items.items()
    }
    items |= {f"new{i}": {"title": f"New {i}", "description": "A fresh film."} for i in range(3)}
    root = world["root"]
    (root / "all.item.json").write_text(json.dumps(items))
    (root / "all.inter.json").write_text(json.dumps({"u0": ["0", "new0"]}))
    return str(root / "all")


def test_cli_grows_the_adapter_exactly_like_grow_adapter(world, capsys):
    assert grow(world, "grown") == 0  # the base recorded in the adapter: no --model_name_or_path
    out = capsys.readouterr().out.splitlines()
    parent, child = world["parent"], world["child"]
    summary = json.loads(out[0])
    assert summary["new_tokens"] == child.n_tokens - parent.n_tokens > 0 and summary["rows"] == child.n_tokens
    assert summary["new_items"] == 3 and "grounding" not in summary
    assert out[1] == f"saved to {world['root'] / 'grown'}"
    got = load_file(world["root"] / "grown" / WEIGHTS)
    want = load_file(world["root"] / "reference" / WEIGHTS)
    assert got.keys() == want.keys()
    assert any("lora_" in k for k in got) and any("grounded_head" in k for k in got)
    for key, value in want.items():
        assert torch.equal(got[key], value), key  # trained rows, new rows and LoRA, bit for bit
    assert not list(world["root"].glob(".grown*"))  # no temporary folder left beside it
    config = json.loads((world["root"] / "grown" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == world["base"]  # later commands find the base by it
    _, reloaded = sid_model(world["base"], child, adapter=str(world["root"] / "grown"))  # checks the index
    assert sid_record(reloaded)["sid_index_fingerprint"] == child.fingerprint()


@pytest.mark.parametrize("bf16", [False, True])
def test_ground_moves_only_the_rows_the_new_items_use(world, capsys, bf16):
    catalogue = write_catalogue(world)
    dtype = ["--dtype", "bfloat16", "--bf16"] if bf16 else []
    model = ["--model_name_or_path", world["base"], *dtype]
    assert grow(world, "plain", *model) == 0
    capsys.readouterr()
    steps = [
        "--max_steps",
        "3",
        "--learning_rate",
        "1e-2",
        "--per_device_train_batch_size",
        "4",
        "--replay",
        "1",
    ]
    assert grow(world, "grounded", *model, "--ground", catalogue, *steps) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[0])["grounding"]
    assert summary["steps"] == 3 and summary["replayed"] == 3 and len(summary["loss"]) == 2
    parent, child = world["parent"], world["child"]
    used = rows_used(child, child.item_ids[parent.n_items :])
    assert summary["trained_rows"] == len(used)
    mask = torch.zeros(child.n_tokens, dtype=torch.bool)
    mask[used] = True
    plain = load_file(world["root"] / "plain" / WEIGHTS)
    grounded = load_file(world["root"] / "grounded" / WEIGHTS)
    assert plain.keys() == grounded.keys()
    rows = [k for k in plain if "grounded_" in k]
    assert len(rows) == 2  # input rows and the untied head's
    for key in plain:
        if key in rows:
            assert torch.equal(grounded[key][~mask], plain[key][~mask]), key
            assert not torch.equal(grounded[key][mask], plain[key][mask]), key
        else:
            assert torch.equal(grounded[key], plain[key]), key  # LoRA untouched


def test_refusals_exit_2_with_the_reason(world, capsys):
    root = world["root"]
    assert grow(world, "grown", "--model_name_or_path", world["base"]) == 0
    capsys.readouterr()
    assert grow(world, "grown", "--model_name_or_path", world["base"]) == 2
    err = capsys.readouterr().err
    assert "already holds an adapter" in err and "--overwrite" in err
    assert grow(world, "grown", "--model_name_or_path", world["base"], "--overwrite") == 0
    assert not list(root.glob(".grown*"))  # the replaced copy is gone too
    capsys.readouterr()

    assert grow(world, "adapter", "--model_name_or_path", world["base"], "--overwrite") == 2
    assert "--output_dir is the trained adapter's directory" in capsys.readouterr().err

    (root / "notes").mkdir()
    (root / "notes" / "todo.txt").write_text("keep me")
    assert grow(world, "notes", "--model_name_or_path", world["base"], "--overwrite") == 2
    assert "holds files but no adapter" in capsys.readouterr().err
    assert (root / "notes" / "todo.txt").read_text() == "keep me"

    toy_index(toy_catalogue(), seed=1).save(root / "fresh")  # a fresh build, not grown from the parent
    assert grow(world, "other", "--model_name_or_path", world["base"], child="fresh") == 2
    assert "did not grow from" in capsys.readouterr().err
    assert not (root / "other").exists()

    (root / "only_old.item.json").write_text(json.dumps({"0": {"title": "Old"}}))
    (root / "only_old.inter.json").write_text(json.dumps({"u0": ["0"]}))
    assert (
        grow(world, "other", "--model_name_or_path", world["base"], "--ground", str(root / "only_old")) == 2
    )
    assert "holds none of the 3 new items" in capsys.readouterr().err
