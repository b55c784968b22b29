"""Diagnostics of real adapters: saved grounded adapters + SID index -> report, runner folders, the CLI."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.toy_catalogue import toy_catalogue, toy_vectors

from peft_grounded.diagnostics import (
    ReportConfig,
    diagnose,
    diagnose_runs,
    find_run_checkpoints,
    load_sid_rows,
    load_vocabulary,
)
from peft_grounded.diagnostics.measure import principal_components
from peft_grounded.sids import Catalogue, Item, build_sids

WIDTH = 64  # the tiny model's width; the index's vectors have the same width, so centroid init truncates


def make_index(catalogue: Catalogue, codes: int = 8, seed: int = 0):
    return build_sids(
        catalogue,
        vectors=toy_vectors(catalogue, dim=WIDTH, seed=seed),
        levels=2,
        codes=codes,
        encoder_fingerprint={"kind": "toy", "model": "clusters"},
        show_progress=False,
    )


def save_adapter(base_dir: Path, index, init: str, out: Path) -> Path:
    """A grounded adapter made the way the runner makes it: base loaded from disk, SID tokens added."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from peft_grounded import GroundedTokenConfig, add_tokens

    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    model = AutoModelForCausalLM.from_pretrained(base_dir)
    new = add_tokens(tokenizer, model, index.token_strings)
    vectors = index.adapter_init("items")[1] if init == "centroid" else None
    config = GroundedTokenConfig(token_indices=new, init=init, init_vectors=vectors, task_type="CAUSAL_LM")
    get_peft_model(model, config).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory, smollm2_dir):
    from conftest import build_tiny_model
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("diagnose")
    catalogue = toy_catalogue()
    index = make_index(catalogue)  # levels (8, 8, 1): two level-0 codes per genre
    index.save(root / "sids")
    base = root / "base"
    build_tiny_model("llama", tied=True).save_pretrained(base)
    AutoTokenizer.from_pretrained(smollm2_dir).save_pretrained(base)
    adapters = {
        init: save_adapter(base, index, init, root / init)
        for init in ("mean", "centroid", "gaussian", "random")
    }
    return {"root": root, "catalogue": catalogue, "index": index, "base": base, "adapters": adapters}


def metrics_of(files) -> dict[str, dict]:
    return {m["name"]: m for m in json.loads(files.metrics_json.read_text())["snapshots"]}


def test_mean_and_centroid_adapters_show_their_geometry(world, tmp_path):
    adapters = world["adapters"]
    files = diagnose(
        [adapters["mean"], adapters["centroid"], adapters["gaussian"]],
        world["root"] / "sids",  # a directory, loaded like the CLI does
        out_dir=tmp_path,
        catalogue=world["catalogue"],
        config=ReportConfig(n_text=10, purity_m=1),
    )
    metrics = metrics_of(files)
    assert list(metrics) == ["mean", "centroid", "gaussian"]

    mean = metrics["mean"]  # every row the vocabulary mean
    assert mean["effective_rank"] == pytest.approx(1.0)
    assert mean["effective_rank_centred"] == 0.0
    assert mean["rsa"]["pearson"] is None and mean["rsa_centred"]["pearson"] is None  # undefined -> null
    assert mean["purity"]["value"] == pytest.approx(mean["purity"]["chance"])

    # centroid init with truncation: rows = vocabulary mean + c * (centroid - mean centroid)
    centroid = metrics["centroid"]
    assert centroid["rsa_centred"]["pearson"] == pytest.approx(1.0, abs=1e-5)
    assert centroid["rsa_centred"]["n_pairs"] == 17 * 16 // 2
    reference = principal_components(world["index"].centroids["items"]).singular_values
    clear = reference > 1e-3 * reference[0]  # the rest is float32 rounding of dependent centroids
    ratio = np.asarray(centroid["singular_values_centred"])[clear] / reference[clear]
    assert clear.sum() >= 10 and np.allclose(
        ratio, ratio[0], rtol=1e-4
    )  # same spectrum, up to the norm match
    assert centroid["purity"]["value"] == 1.0 > centroid["purity"]["chance"]  # each code's twin genre code
    assert metrics["gaussian"]["rsa_centred"]["pearson"] < 0.6

    written = json.loads(files.metrics_json.read_text())
    special = set(load_vocabulary(world["base"]).special_ids)
    assert len(written["heatmap"]["text_ids"]) == 10 and not special & set(written["heatmap"]["text_ids"])
    nearest = json.loads(files.nearest_json.read_text())
    assert set(nearest["centroid"]) == set(world["index"].token_strings)
    assert all(len(entries) == 5 for entries in nearest["centroid"].values())

    markdown = files.markdown.read_text()
    assert "50 SID tokens asked for, only 17 exist: showing all 17." in markdown  # clamped, as documented
    assert "Vocabulary: 49152 rows from" in markdown and "model.embed_tokens.weight" in markdown
    assert "training target (leave-one-out split)" in markdown
    assert "from the catalogue" in markdown and "Skipped" not in markdown


def test_rows_come_back_in_the_index_order_whatever_the_adapter_stored(world, tmp_path):
    from peft_grounded.adapter.saved import adapter_rows

    tokens = world["index"].token_strings
    shuffled = tokens[::-1]
    loaded = load_sid_rows(world["adapters"]["gaussian"], shuffled)
    config = json.loads((world["adapters"]["gaussian"] / "adapter_config.json").read_text())
    expected, _ = adapter_rows(world["adapters"]["gaussian"], config["token_indices"], shuffled)
    assert torch.equal(loaded.rows, expected.float())
    assert loaded.original_vocab_size == 49152 and loaded.base_model == str(world["base"])


def test_untied_heads_give_their_own_rows_and_vocabulary(world, tmp_path):
    from conftest import build_tiny_model
    from safetensors.torch import load_file

    base = tmp_path / "untied"
    model = build_tiny_model("llama", tied=False, seed=2)
    model.save_pretrained(base)
    shutil.copy(world["base"] / "tokenizer.json", base)
    shutil.copy(world["base"] / "tokenizer_config.json", base)
    adapter = save_adapter(base, world["index"], "gaussian", tmp_path / "adapter")
    state = load_file(adapter / "adapter_model.safetensors")
    (head,) = (v for k, v in state.items() if k.endswith("grounded_head"))
    (embedding,) = (v for k, v in state.items() if k.endswith("grounded_embedding"))
    tokens = world["index"].token_strings
    assert torch.equal(load_sid_rows(adapter, tokens, matrix="output").rows, head)
    assert torch.equal(load_sid_rows(adapter, tokens).rows, embedding)
    tied = world["adapters"]["gaussian"]  # one set of rows serves both matrices
    assert torch.equal(load_sid_rows(tied, tokens, matrix="output").rows, load_sid_rows(tied, tokens).rows)
    vocabulary = load_vocabulary(base, 49152, matrix="output")
    assert torch.equal(vocabulary.rows, model.lm_head.weight.detach())
    assert "lm_head.weight" in vocabulary.source and len(vocabulary.tokens) == 49152


def test_strict_heatmap_refuses_too_few_tokens_before_writing(world, tmp_path):
    with pytest.raises(ValueError, match="only 17 exist"):
        diagnose(
            [world["adapters"]["mean"]],
            world["index"],
            out_dir=tmp_path / "out",
            base_model=False,
            config=ReportConfig(strict=True),
        )
    assert not (tmp_path / "out").exists()


def test_an_index_that_does_not_match_the_checkpoint_is_refused(world, tmp_path):
    other = make_index(world["catalogue"], codes=4)  # 4 + 4 + 2 tokens
    with pytest.raises(
        ValueError,
        match=r"it has 17 new tokens, the index 10; missing from the adapter: \['<c_1>'\]; not in the index: \['<a_4>'",
    ):
        diagnose([world["adapters"]["centroid"]], other, out_dir=tmp_path / "out", base_model=False)
    assert not (tmp_path / "out").exists()


def test_a_different_base_model_is_refused(world, tmp_path):
    from conftest import build_tiny_model

    wrong = tmp_path / "other-base"
    build_tiny_model("llama", tied=True, seed=1).save_pretrained(wrong)
    with pytest.raises(ValueError, match="not those the adapters were made on"):
        diagnose([world["adapters"]["mean"]], world["index"], out_dir=tmp_path / "out", base_model=wrong)
    assert not (tmp_path / "out").exists()


def test_a_catalogue_without_categories_skips_purity_and_says_so(world, tmp_path):
    bare = world["catalogue"]
    bare = Catalogue(
        "bare",
        {i: Item(i, title=item.title) for i, item in bare.items.items()},
        bare.sequences,
    )
    files = diagnose(
        [world["adapters"]["centroid"]],
        world["index"],
        out_dir=tmp_path,
        base_model=False,
        catalogue=bare,
        config=ReportConfig(n_sid=6),
    )
    markdown = files.markdown.read_text()
    assert (
        "The catalogue gives no categories for the level-0 codes: neighbourhood purity is skipped."
        in markdown
    )
    assert "Skipped: Neighbourhood purity" in markdown
    assert not (tmp_path / "figures" / "purity.png").exists()
    assert metrics_of(files)["centroid"]["purity"] is None
    assert metrics_of(files)["centroid"]["popularity_r2"] is not None  # the catalogue still gives targets


# ----------------------------------------------------------------------------------- runner folders


def fake_run(root: Path, world, strategy: str, seed: int, stages: dict[str, str], index=None) -> Path:
    """A strategy folder laid out as run_strategy writes it, with its adapters copied in.

    ``metrics.json`` records absolute stage paths of a folder that no longer exists (moved runs).
    """
    from peft_grounded.training import runs

    out = root / f"{strategy}-seed{seed}"
    manifest = {
        "strategy": {"name": strategy, "init": "mean", "ground": "grounding" in stages},
        "budget": {"seed": seed},
        "index": (index or world["index"]).fingerprint(),
    }
    runs.write_json_atomic(out / "run.json", manifest)
    for stage, init in stages.items():
        (out / stage).mkdir(parents=True)
        if init:
            shutil.copytree(world["adapters"][init], out / stage / "adapter")
    if stages.get("sft"):
        moved = {stage: f"/elsewhere/{out.name}/{stage}/adapter" for stage in stages}
        runs.write_json_atomic(out / "metrics.json", {"strategy": strategy, "stages": moved})
    return out


@pytest.fixture(scope="module")
def run_folder(world, tmp_path_factory):
    root = tmp_path_factory.mktemp("demo") / "strategies"
    fake_run(root, world, "gti", 0, {"init": "mean", "grounding": "random", "sft": "gaussian"})
    fake_run(root, world, "mean", 0, {"init": "mean", "sft": "gaussian"})
    fake_run(root, world, "mean", 1, {"init": "mean", "sft": "gaussian"})
    fake_run(root, world, "centroid", 0, {"init": "centroid", "sft": ""})  # SFT interrupted: no adapter
    return root


def test_runner_folders_become_named_checkpoints(run_folder):
    folder = find_run_checkpoints(run_folder.parent)  # the demo's output folder: its strategies/
    names = [c.name for c in folder.checkpoints]
    assert names == ["mean/init", "mean/sft", "centroid/init", "gti/init", "gti/grounding", "gti/sft"]
    assert [c.stage for c in folder.checkpoints][:2] == ["init", "sft"]
    assert folder.checkpoints[1].path == run_folder / "mean-seed0" / "sft" / "adapter"  # not the stale path
    assert any("Seeds [1] left out" in note for note in folder.notes)
    assert any(note.startswith("centroid/sft: not finished") for note in folder.notes)

    every = find_run_checkpoints(run_folder, seeds="all", stages=["init"], strategies=["mean"])
    assert [c.name for c in every.checkpoints] == ["mean-seed0/init", "mean-seed1/init"]
    single = find_run_checkpoints(run_folder / "gti-seed0")
    assert [c.name for c in single.checkpoints] == ["gti/init", "gti/grounding", "gti/sft"]
    with pytest.raises(FileNotFoundError, match="holds no strategy runs"):
        find_run_checkpoints(run_folder / "gti-seed0" / "sft")


def test_diagnose_runs_end_to_end(world, run_folder, tmp_path):
    files = diagnose_runs(
        run_folder,
        world["index"],
        out_dir=tmp_path,
        catalogue=world["catalogue"],
        config=ReportConfig(n_text=8),
    )
    names = [m.name for m in files.metrics]
    assert names == ["mean/init", "mean/sft", "centroid/init", "gti/grounding"]  # duplicates shown once
    markdown = files.markdown.read_text()
    assert "gti/init: rows identical to mean/init, shown once." in markdown
    assert "gti/sft: rows identical to mean/sft, shown once." in markdown  # the same adapter copied in
    assert "centroid/sft: not finished" in markdown
    assert {m.stage for m in files.metrics} == {"init", "sft", "grounding"}
    assert math.isclose(files.metrics[0].spectrum.effective_rank, 1.0)


def test_a_real_runner_output_is_diagnosed(world, tmp_path):
    """One step of grounding and SFT through run_strategy: the folder it writes is what diagnose_runs reads."""
    from peft_grounded.pipeline import Budget, Experiment, run_strategy

    experiment = Experiment(str(world["base"]), world["catalogue"], world["index"])
    from peft_grounded.evaluation import EvalSettings

    budget = Budget.from_training(
        dict(per_device_train_batch_size=2, max_length=64, disable_tqdm=True),
        grounding=dict(max_steps=1),
        sft=dict(max_steps=1),
        lora=dict(r=2),
        evaluation=EvalSettings(users=1, num_beams=2, ks=(1, 2)),
        curve_users=1,
    )
    run_strategy("gti", experiment, budget, tmp_path / "runs" / "gti-seed0")
    files = diagnose_runs(
        tmp_path / "runs",
        world["index"],
        out_dir=tmp_path / "report",
        split=experiment.split,
        config=ReportConfig(n_text=4, purity_m=1),
    )
    assert [(m.name, m.stage) for m in files.metrics] == [
        ("gti/init", "init"),
        ("gti/grounding", "grounding"),
        ("gti/sft", "sft"),
    ]
    init, grounded, _ = files.metrics
    assert init.spectrum.effective_rank == pytest.approx(1.0)  # GTI starts from mean init
    assert grounded.spectrum_centred.effective_rank > 1.0  # one step of grounding moved the rows apart
    assert "Code frequency: how often each code is a training target" in files.markdown.read_text()


def test_runs_trained_with_another_index_are_refused(world, tmp_path):
    other = make_index(world["catalogue"], seed=3)  # same tokens, other item assignment
    assert other.token_strings == world["index"].token_strings
    assert other.sid_texts() != world["index"].sid_texts()
    fake_run(tmp_path / "runs", world, "mean", 0, {"init": "mean"}, index=other)
    with pytest.raises(ValueError, match="trained with another SID index"):
        diagnose_runs(tmp_path / "runs", world["index"], out_dir=tmp_path / "out", base_model=False)


# --------------------------------------------------------------------------------------------- CLI


def test_cli_writes_the_report_and_reports_bad_input(world, run_folder, tmp_path, capsys):
    from peft_grounded.cli import main

    out = tmp_path / "report"
    code = main(
        [
            "diagnose",
            str(world["adapters"]["centroid"]),
            "--name",
            "centroid-alone",
            "--runs",
            str(run_folder),
            "--stages",
            "init",
            "--sid-index",
            str(world["root"] / "sids"),
            "--n-text",
            "6",
            "--html",
            "--output_dir",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert (out / "report.md").is_file() and (out / "report.html").is_file()
    names = [m["name"] for m in json.loads((out / "metrics.json").read_text())["snapshots"]]
    assert names == [
        "centroid-alone",
        "mean/init",
    ]  # centroid/init repeats centroid-alone, gti/init mean/init
    assert (
        "Categories: the majority level-0 label of each code's items (depth 0), from the categories stored"
        in (out / "report.md").read_text()
    )
    assert "centroid-alone" in printed and f"report: {out / 'report.md'}" in printed

    code = main(["diagnose", "--sid-index", str(world["root"] / "sids"), "--output_dir", str(tmp_path / "x")])
    assert code == 2 and "give ADAPTER_DIR" in capsys.readouterr().err
    bad = make_index(world["catalogue"], codes=4).save(tmp_path / "other-sids")
    code = main(
        [
            "diagnose",
            str(world["adapters"]["mean"]),
            "--sid-index",
            str(bad),
            "--output_dir",
            str(tmp_path / "y"),
        ]
    )
    assert code == 2 and "does not match the SID index" in capsys.readouterr().err
    assert not (tmp_path / "y").exists()
