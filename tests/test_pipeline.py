"""The demo pipeline (smoke preset) and the stage commands, end to end on a tiny model and a toy catalogue."""

from __future__ import annotations

import json

import pytest
from toy_catalogue import toy_catalogue, toy_index

from peft_grounded.cli import main
from peft_grounded.pipeline import run_demo


@pytest.fixture
def model_dir(tmp_path, tiny_model_factory, tokenizer):
    path = tmp_path / "base"
    tiny_model_factory("llama", False).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def test_smoke_demo_runs_every_stage_and_resumes(tmp_path, model_dir):
    out = tmp_path / "demo"
    summary = run_demo("smoke", out, model=model_dir, catalogue=toy_catalogue(), diagnostics=False)
    assert set(summary["strategies"]) == {"mean", "centroid_gti"}
    for name in summary["strategies"]:
        metrics = summary["strategies"][name][0]
        assert metrics["test"]["decoding"]["invalid"] == 0
        assert {"all", "cold"} <= set(metrics["test"])
    report = (out / "report.md").read_text()
    assert "| mean |" in report and "| centroid_gti |" in report and "Timings" in report
    reference = summary["popularity_reference"]["test"]["all"]  # the same sampled users as the strategies
    assert reference["users"] == summary["strategies"]["mean"][0]["test"]["all"]["users"]
    assert "| popularity (reference, no model) |" in report
    assert "## Target log-likelihood (test)" in report
    assert set(summary["likelihood"]) == {"mean", "centroid_gti"}
    assert (out / "sids" / "sid_index.json").is_file()
    trained = {p: p.stat().st_mtime_ns for p in out.glob("strategies/*/*/adapter/adapter_model.safetensors")}
    trained = {p: t for p, t in trained.items() if p.parts[-3] in ("grounding", "sft")}
    assert len(trained) == 3  # mean: sft; centroid_gti: grounding and sft
    again = run_demo("smoke", out, model=model_dir, catalogue=toy_catalogue(), diagnostics=False)
    assert again["strategies"] == summary["strategies"]  # finished strategies are reused, not retrained
    assert {p: p.stat().st_mtime_ns for p in trained} == trained  # (equal metrics alone would not show it)


def test_stage_commands(tmp_path, model_dir):
    catalogue = toy_catalogue()
    index = toy_index(catalogue)
    index.save(tmp_path / "sids")
    # the CLI reads catalogues from disk: write the toy catalogue in the LC-Rec JSON format
    items = {
        i: {"title": it.title, "description": it.description, "categories": ", ".join(it.categories)}
        for i, it in catalogue.items.items()
    }
    (tmp_path / "toy.item.json").write_text(json.dumps(items))
    (tmp_path / "toy.inter.json").write_text(json.dumps({u: list(s) for u, s in catalogue.sequences.items()}))
    data = ["--model", model_dir, "--sids", str(tmp_path / "sids"), "--catalogue", str(tmp_path / "toy")]
    tiny = ["--steps", "2", "--batch-size", "4", "--save-steps", "2", "--max-length", "96"]
    assert main(["ground", *data, *tiny, "--init", "centroid", "--output", str(tmp_path / "g")]) == 0
    assert (tmp_path / "g" / "adapter" / "adapter_model.safetensors").is_file()
    assert (
        main(
            [
                "sft",
                *data,
                *tiny,
                "--grounded",
                str(tmp_path / "g" / "adapter"),
                "--lora-r",
                "2",
                "--lora-target-modules",
                "q_proj,v_proj",
                "--output",
                str(tmp_path / "s"),
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "evaluate",
                *data,
                "--adapter",
                str(tmp_path / "s" / "adapter"),
                "--users",
                "4",
                "--ks",
                "1",
                "5",
                "10",
                "--num-beams",
                "10",
                "--out",
                str(tmp_path / "e"),
            ]
        )
        == 0
    )
    metrics = json.loads((tmp_path / "e" / "metrics.json").read_text())
    assert metrics["test"]["all"]["users"] == 4 and metrics["test"]["decoding"]["invalid"] == 0
    # the adapter records its SID index: another index (same catalogue, other seed) is refused, clearly
    other = toy_index(catalogue, seed=1)
    assert other.fingerprint() != index.fingerprint()
    other.save(tmp_path / "other-sids")
    wrong = [
        "--model",
        model_dir,
        "--sid-index",
        str(tmp_path / "other-sids"),
        "--catalogue",
        str(tmp_path / "toy"),
    ]
    assert (
        main(
            [
                "evaluate",
                *wrong,
                "--adapter",
                str(tmp_path / "s" / "adapter"),
                "--output",
                str(tmp_path / "e2"),
            ]
        )
        == 2
    )
    assert not (tmp_path / "e2").exists()


def test_demo_refuses_to_mix_settings_in_one_folder(tmp_path, model_dir):
    from dataclasses import replace

    from peft_grounded.pipeline import PRESETS
    from peft_grounded.runs import RunMismatchError

    out = tmp_path / "demo"
    run_demo(
        "smoke", out, model=model_dir, catalogue=toy_catalogue(), strategies=("mean",), diagnostics=False
    )
    with pytest.raises(RunMismatchError, match="codes: 8 -> 4"):
        run_demo(
            replace(PRESETS["smoke"], codes=4),
            out,
            model=model_dir,
            catalogue=toy_catalogue(),
            diagnostics=False,
        )
