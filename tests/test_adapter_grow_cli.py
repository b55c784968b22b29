"""``peft-grounded grow-adapter``: the CLI's grown adapter equals the in-process one, --ground moves only the
new items' rows, and bad outputs or indices are refused with exit code 2."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.growth_fixtures import grow, grow_world
from helpers.toy_catalogue import toy_catalogue, toy_index
from safetensors.torch import load_file

from peft_grounded.new_items import rows_used
from peft_grounded.sids.extended_base import sid_model, sid_record

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


def test_the_rule_on_a_behaviour_index_reads_the_items_text_from_catalogue(
    tmp_path, tokenizer, tiny_model_factory
):
    """``grow-adapter --interactions F --catalogue C`` on an index built from behaviour: the stored rule's text
    expert holds the items' encoded text; without ``--catalogue`` it warns and keeps the text-mapped vectors."""
    import warnings

    import numpy as np
    from helpers.growth_fixtures import saved_adapter
    from helpers.serving_fixtures import write_histories
    from helpers.shop import shop_catalogue

    from peft_grounded.cli import main
    from peft_grounded.new_items import NewItemRule, add_items, index_vectors
    from peft_grounded.sids import build_sids
    from peft_grounded.sids.behaviour import ItemVectorsConfig

    catalogue, _ = shop_catalogue(n_users=40)
    new_ids = ["i40", "i41"]  # never bought: added later, from their text
    vectors = ItemVectorsConfig(item_vectors="behaviour", behaviour_epochs=20, behaviour_min_interactions=3)
    old = catalogue.subset([i for i in catalogue.items if i not in new_ids])
    parent = build_sids(old, tmp_path / "sids", levels=2, codes=4, item_vectors=vectors, show_progress=False)
    child = add_items(parent, [catalogue.items[i] for i in new_ids], show_progress=False)
    child.save(tmp_path / "sids-v2")
    saved_adapter(tmp_path, tokenizer, tiny_model_factory, parent, lora=False)
    (tmp_path / "shop.item.json").write_text(
        json.dumps({i: {"title": it.title} for i, it in catalogue.items.items()})
    )
    (tmp_path / "shop.inter.json").write_text(
        json.dumps({u: list(s) for u, s in catalogue.sequences.items()})
    )
    logged = write_histories(
        tmp_path / "logged.jsonl", {"a": ["i0", "i40"], "b": ["i21", "i41"], "c": ["i1", "i2"]}
    )

    def grow_with(out: str, *extra: str) -> NewItemRule:
        args = [
            "grow-adapter",
            "--adapter",
            str(tmp_path / "adapter"),
            "--parent-index",
            str(tmp_path / "sids"),
        ]
        args += ["--sid-index", str(tmp_path / "sids-v2"), "--output_dir", str(tmp_path / out)]
        assert main([*args, "--interactions", str(logged), *extra]) == 0
        return NewItemRule.load(tmp_path / out)

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*pass the catalogue.*")
        read = grow_with("with-text", "--catalogue", str(tmp_path / "shop"))
    np.testing.assert_allclose(read.mixture.vectors, child.text_vectors(catalogue), rtol=1e-5, atol=1e-6)
    with pytest.warns(UserWarning, match="pass the catalogue"):
        mapped = grow_with("without")

    def unit(x):
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    # the mixture keeps unit rows: the index's own (text-mapped behaviour) vectors' directions
    np.testing.assert_allclose(unit(mapped.mixture.vectors), unit(index_vectors(child)), rtol=1e-5, atol=1e-6)
    assert mapped.mixture.vectors.shape != read.mixture.vectors.shape  # 64-d behaviour, 384-d MiniLM text

    # --log_steps: the new items' rows tuned on the log (all but the held-out history the choice reads);
    # every other weight as the untuned grow wrote it
    read_again = grow_with("tuned", "--catalogue", str(tmp_path / "shop"), "--log_steps", "3")
    assert read_again.fitted_on["choice_pairs"] == 1  # of the 3 logged histories: 1 held out, 2 trained on
    untuned = load_file(str(tmp_path / "with-text" / "adapter_model.safetensors"))
    tuned = load_file(str(tmp_path / "tuned" / "adapter_model.safetensors"))
    rows = rows_used(child, new_ids)
    assert untuned.keys() == tuned.keys()
    moved = set()
    for name, weight in untuned.items():
        if weight.shape[0] == child.n_tokens:  # a grounded matrix: its rows in the child's token order
            others = [r for r in range(child.n_tokens) if r not in rows]
            assert torch.equal(weight[others], tuned[name][others]), name
            if not torch.equal(weight[rows], tuned[name][rows]):
                moved.add(name)
        else:
            assert torch.equal(weight, tuned[name]), name
    assert moved
    from peft_grounded.cli.growth import grow_adapter_into

    with pytest.raises(ValueError, match="give them"):
        grow_adapter_into(
            tmp_path / "adapter", tmp_path / "sids", tmp_path / "sids-v2", tmp_path / "x", log_steps=2
        )
