"""The recipe grid's scripts: bench_demo_recipe's flags change only what they name, and recipe_table pairs
one strategy's users across recipe folders; no model runs."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest


def write_recipe(root, ranks, nll, steps=100, epoch=0.5, seconds=60.0, strategy="centroid", part="valid"):
    folder = root / "strategies" / f"{strategy}-seed0"
    (folder / "sft").mkdir(parents=True)
    users = [
        {"user": str(u), "rank": r, "constrained_nll": n, "all": True, "cold": False}
        for u, (r, n) in enumerate(zip(ranks, nll, strict=True))
    ]
    (folder / "metrics.json").write_text(json.dumps({"users": {part: users}, "threads": 1}))
    log = [
        {"loss": 2.0, "step": steps, "epoch": epoch, "seconds": seconds},
        {"step": steps, "train_loss": 2.0},
    ]
    (folder / "sft" / "log_history.json").write_text(json.dumps(log))


def test_recipes_are_paired_by_user_against_the_reference(tmp_path, capsys):
    from benchmarks import recipe_table

    rng = np.random.default_rng(0)
    n = 60
    base = [int(r) if r < 12 else None for r in rng.integers(0, 30, n)]
    other = [int(r) if r < 8 else None for r in rng.integers(0, 30, n)]
    write_recipe(tmp_path / "base", base, rng.normal(7, 1, n).tolist())
    write_recipe(
        tmp_path / "other", other, rng.normal(7.3, 1, n).tolist(), steps=300, epoch=1.5, seconds=1800.0
    )
    recipe_table.main([f"base={tmp_path / 'base'}", f"lr={tmp_path / 'other'}"])
    out = capsys.readouterr().out
    assert "centroid, valid users: 60; paired against base" in out
    row = next(line for line in out.splitlines() if line.startswith("| lr |")).split("|")
    hit = lambda ranks: np.array([r is not None and r < 10 for r in ranks], dtype=float)  # noqa: E731
    assert row[2].strip() == "300" and row[4].strip() == "30.0" and row[5].strip() == "6.00"
    assert float(row[10].split("[")[0]) == pytest.approx((hit(other) - hit(base)).mean(), abs=5e-5)
    with pytest.raises(SystemExit, match="no 'test' users"):
        recipe_table.main([f"base={tmp_path / 'base'}", "--part", "test"])
    with pytest.raises(SystemExit, match="LABEL=FOLDER"):
        recipe_table.main([str(tmp_path / "base")])
    with pytest.raises(SystemExit, match="--reference 'x'"):
        recipe_table.main([f"base={tmp_path / 'base'}", "--reference", "x"])


def test_demo_recipe_flags_change_only_what_they_name():
    from benchmarks import bench_demo_recipe
    from peft_grounded.pipeline.demo import PRESETS

    default = PRESETS["default"]
    same = bench_demo_recipe.preset(*bench_demo_recipe.parse_args(["--out", "x"]))
    assert same == default
    args = [
        "--out",
        "x",
        "--lora-r",
        "32",
        "--max-history",
        "9",
        "--peers",
        "popularity",
        "--eval-parts",
        "valid",
    ]
    args += ["--sft-minutes", "30"]
    spec = bench_demo_recipe.preset(*bench_demo_recipe.parse_args(args))
    assert spec.budget.lora == default.budget.lora | {"r": 32, "lora_alpha": 64}
    assert spec.prompt_format() == replace(default.prompt_format(), max_history=9)
    assert (
        spec.peers == ("popularity",)
        and spec.budget.parts == ("valid",)
        and spec.budget.eval_parts == ("valid",)
    )
    assert spec.budget.sft.max_minutes == 30 and spec.budget.sft.max_steps <= 0
    assert spec.budget.sft.learning_rate == default.budget.sft.learning_rate
    assert spec.budget.grounding == default.budget.grounding and spec.layers == default.layers
    none = bench_demo_recipe.preset(*bench_demo_recipe.parse_args(["--out", "x", "--peers"]))
    assert none.peers == ()
    curves = ["--out", "x", "--no-exclude-history", "--eval-every", "700", "--curve-users", "200"]
    spec = bench_demo_recipe.preset(*bench_demo_recipe.parse_args(curves))
    assert spec.budget.evaluation == replace(default.budget.evaluation, exclude_history=False)
    assert (spec.budget.eval_every, spec.budget.curve_users) == (700, 200)
    assert spec.budget.curve_every == default.budget.curve_every
    assert default.budget.evaluation.exclude_history and default.budget.eval_every == 0  # as recommend serves
    kept = bench_demo_recipe.preset(*bench_demo_recipe.parse_args([*curves, "--keep-best"]))
    assert kept.budget.keep_best and not spec.budget.keep_best and not default.budget.keep_best
    with pytest.raises(ValueError, match="keep_best needs validation points"):  # before any work
        bench_demo_recipe.parse_args(["--out", "x", "--keep-best"])
    levers = ["--out", "x", "--codes", "128", "--lora-dropout", "0.1", "--sft-set", "weight_decay=0.05"]
    spec = bench_demo_recipe.preset(*bench_demo_recipe.parse_args([*levers, "--balanced", "all"]))
    assert spec.codes == 128 and default.codes == 64
    assert spec.balanced == "all" and default.balanced == "none"
    blocks = bench_demo_recipe.preset(*bench_demo_recipe.parse_args(["--out", "x", "--block-lr", "1e-4"]))
    assert blocks.budget == replace(default.budget, block_lr=1e-4) and default.budget.block_lr is None
    with pytest.raises(ValueError, match="block_lr"):  # the blocks are not saved: no best to keep
        bench_demo_recipe.parse_args([*curves, "--keep-best", "--block-lr", "1e-4"])
    assert spec.budget.lora == default.budget.lora | {"lora_dropout": 0.1}
    assert spec.budget.sft == replace(default.budget.sft, weight_decay=0.05)
    padded = bench_demo_recipe.preset(
        *bench_demo_recipe.parse_args(["--out", "x", "--sft-set", "padding_free=false"])
    )
    assert padded.budget.sft == replace(default.budget.sft, padding_free=False)
    assert default.budget.sft.padding_free is None  # the trainer's choice
    assert (
        spec.budget.grounding == default.budget.grounding
        and spec.budget.evaluation == default.budget.evaluation
    )
    with pytest.raises(ValueError, match="lora_dropout"):  # the LoRA's own check, before any work
        bench_demo_recipe.parse_args(["--out", "x", "--lora-dropout", "1.5"])
    # the package's RowStart, parsed as it is, the preset's start its default; the strategies choose the init
    start = bench_demo_recipe.preset(*bench_demo_recipe.parse_args(["--out", "x", "--init-scale", "1"]))
    assert start.budget == replace(default.budget, start=replace(default.budget.start, init_scale=1.0))
    with pytest.raises(ValueError, match="init_scale"):
        bench_demo_recipe.parse_args(["--out", "x", "--init_scale", "0"])
    with pytest.raises(SystemExit, match="--init centroid: each strategy starts its rows"):
        bench_demo_recipe.parse_args(["--out", "x", "--init", "centroid"])
    full_head = bench_demo_recipe.preset(
        *bench_demo_recipe.parse_args(["--out", "x", "--sft-set", "sid_softmax=false"])
    )
    assert (
        full_head.budget.sft == replace(default.budget.sft, sid_softmax=False)
        and default.budget.sft.sid_softmax
    )
    # the stages' learning rates through the setters; the run's seed and strategies through the package's flags
    argv = ["--out", "x", "--sft-set", "learning_rate=1e-3", "--grounding-set", "learning_rate=3e-3"]
    rates = bench_demo_recipe.preset(*bench_demo_recipe.parse_args([*argv, "--seed", "1"]))
    assert rates.budget.sft == replace(default.budget.sft, learning_rate=1e-3) and rates.seeds == (1,)
    assert rates.budget.grounding == replace(default.budget.grounding, learning_rate=3e-3)
    with pytest.raises(SystemExit, match="give --seed"):
        bench_demo_recipe.parse_args(["--out", "x", "--sft-set", "seed=1"])
    chosen = bench_demo_recipe.preset(
        *bench_demo_recipe.parse_args(["--out", "x", "--strategies", "mean,centroid"])
    )
    assert chosen.strategies == ("mean", "centroid") and default.strategies != chosen.strategies
    with pytest.raises(ValueError, match="nonesuch"):  # DemoArguments' own check, before any work
        bench_demo_recipe.parse_args(["--out", "x", "--strategies", "nonesuch"])
    alpha = bench_demo_recipe.preset(*bench_demo_recipe.parse_args(["--out", "x", "--lora-alpha", "8"]))
    assert alpha.budget.lora == default.budget.lora | {"lora_alpha": 8}
