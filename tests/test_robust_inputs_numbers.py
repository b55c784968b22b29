"""Every numeric flag out of range is refused before any work starts: exit code 2, one line naming the
field, its flag, the value and what is allowed; no output folder appears and no user file changes.

The checks live in the settings dataclasses and library functions (RunConfig, EvalSettings, RQKMeansConfig,
the LoRA settings, build_sids, add_items, incremental grounding, ReportConfig), so the Python API refuses the
same values (see the last tests)."""

# ruff: noqa: F811 (the world fixture is imported, then named by the tests)
from __future__ import annotations

import pytest
from helpers.robust_world import build_sids_args, data_args, refused, snapshot, world  # noqa: F401 (world: a fixture)

# (flag values, words the message must hold); each command adds its required arguments
TRAINING = {
    "steps_negative": (
        ["--max_steps", "-5"],
        ["max_steps", "--max_steps", "-5", "falls back to training epochs"],
    ),
    "steps_zero": (["--max_steps", "0"], ["max_steps", "--max_steps", "got 0", "--max_minutes"]),
    "grad_accum_zero": (
        ["--gradient_accumulation_steps", "0"],
        ["gradient_accumulation_steps", "--gradient_accumulation_steps", "positive integer"],
    ),
    "max_examples_zero": (["--max-examples", "0"], ["max_examples", "--max-examples", "got 0"]),
    "batch_size_zero": (
        ["--per_device_train_batch_size", "0"],
        ["per_device_train_batch_size", "--per_device_train_batch_size", "got 0"],
    ),
    "lr_nan": (["--learning_rate", "nan"], ["learning_rate", "--learning_rate", "finite number > 0", "nan"]),
    "lr_zero": (["--learning_rate", "0"], ["learning_rate", "--learning_rate", "> 0"]),
    "lr_negative": (["--learning_rate=-1e-3"], ["learning_rate", "--learning_rate", "-0.001"]),
    "lr_inf": (["--learning_rate", "inf"], ["learning_rate", "inf"]),
    "max_length_zero": (["--max-length", "0"], ["max_length", "--max-length"]),
    "save_steps_zero": (["--save-steps", "0"], ["save_steps", "--save-steps"]),
    "seed_negative": (["--seed", "-1"], ["seed", "--seed", "between 0 and 4294967295"]),
    "minutes_zero": (["--max_minutes", "0"], ["max_minutes", "--max_minutes", "> 0"]),
    "minutes_nan": (["--max_minutes", "nan"], ["max_minutes", "--max_minutes", "nan"]),
    "steps_below_minus_one_with_minutes": (
        ["--max_minutes", "1", "--max_steps", "-4"],
        ["max_steps", "-4", "time alone"],
    ),
}


@pytest.mark.parametrize("case", sorted(TRAINING))
def test_ground_refuses_a_training_number_out_of_range(world, tmp_path, capsys, case):
    flags, words = TRAINING[case]
    before = snapshot(world["root"])
    base = ["--max_steps", "1"] if "--max_steps" not in flags else []
    line = refused(capsys, "ground", *data_args(world), "--output_dir", tmp_path / "out", *base, *flags)
    for word in words:
        assert word in line, (word, line)
    assert not (tmp_path / "out").exists()
    assert snapshot(world["root"]) == before


SFT = {
    "lora_r_zero": (["--lora-r", "0"], ["lora", "r must be a positive integer", "--lora-r"]),
    "lora_alpha_zero": (["--lora-alpha", "0"], ["lora_alpha", "> 0", "--lora-alpha"]),
    "lora_dropout_above_one": (["--lora-dropout", "1.5"], ["lora_dropout", "< 1", "--lora-dropout"]),
    "lora_dropout_negative": (["--lora-dropout", "-0.1"], ["lora_dropout", ">= 0"]),
    "max_history_negative": (["--max-history", "-1"], ["max_history=-1", ">= 0"]),
    "sft_grad_accum_zero": (
        ["--gradient_accumulation_steps", "0"],
        ["gradient_accumulation_steps", "--gradient_accumulation_steps"],
    ),
}


@pytest.mark.parametrize("case", sorted(SFT))
def test_sft_refuses_a_number_out_of_range(world, tmp_path, capsys, case):
    flags, words = SFT[case]
    before = snapshot(world["root"])
    line = refused(
        capsys, "sft", *data_args(world), "--output_dir", tmp_path / "out", "--max_steps", "1", *flags
    )
    for word in words:
        assert word in line, (word, line)
    assert not (tmp_path / "out").exists()
    assert snapshot(world["root"]) == before


EVALUATE = {
    "batch_size_zero": (
        ["--decode-batch-size", "0"],
        ["decode_batch_size must be a positive integer", "--decode-batch-size"],
    ),
    "num_beams_zero": (["--num-beams", "0"], ["num_beams", "--num-beams"]),
    "users_zero": (["--users", "0"], ["users must be a positive integer or None", "--users"]),
    "ks_zero": (["--ks", "0", "5"], ["ks must be positive integers", "--ks"]),
    "cold_max_count_negative": (["--cold-max-count", "-1"], ["cold_max_count", ">= 0"]),
}


@pytest.mark.parametrize("case", sorted(EVALUATE))
def test_evaluate_refuses_a_number_out_of_range(world, tmp_path, capsys, case):
    flags, words = EVALUATE[case]
    before = snapshot(world["root"])
    line = refused(
        capsys,
        "evaluate",
        *data_args(world),
        "--adapter",
        world["adapter"],
        "--output_dir",
        tmp_path / "e",
        *flags,
    )
    for word in words:
        assert word in line, (word, line)
    assert not (tmp_path / "e").exists()
    assert snapshot(world["root"]) == before


BUILD = {
    "max_iter_negative": (["--max-iter", "-3"], ["max_iter", "--max-iter", "-3"]),
    "batch_size_zero": (
        ["--encode-batch-size", "0"],
        ["batch_size", "--encode-batch-size", "positive integer"],
    ),
    "levels_zero": (["--levels", "0"], ["levels must be >= 1", "--levels"]),
    "codes_zero": (["--codes", "0"], ["codes_per_level must be >= 1", "--codes"]),
    "k_core_negative": (["--k-core", "-1"], ["k_core", "--k-core", ">= 0"]),
    "rqvae_epochs_zero": (
        ["--quantizer", "rqvae", "--rqvae-epochs", "0"],
        ["rqvae_epochs", "--rqvae-epochs"],
    ),
    "sample_size_zero": (["--sample-size", "0"], ["sample_size", "--sample-size"]),
    "seed_negative": (["--seed", "-1"], ["seed", "--seed", "between 0 and"]),
    "device_cuda_on_a_cpu_torch": (["--device", "cuda"], ["--device cuda", "without CUDA", "--device cpu"]),
    "device_unknown": (["--device", "gpu0"], ["--device 'gpu0' is not a torch device"]),
}


@pytest.mark.parametrize("case", sorted(BUILD))
def test_build_sids_refuses_a_setting_out_of_range(world, tmp_path, capsys, case):
    flags, words = BUILD[case]
    before = snapshot(world["root"])
    out = tmp_path / "sids"
    line = refused(capsys, *build_sids_args(world, world["catalogue"], out, "--no-cache", *flags))
    for word in words:
        assert word in line, (word, line)
    assert not (tmp_path / "sids").exists()
    assert snapshot(world["root"]) == before


def grow_args(world, tmp_path) -> list:
    return [
        "grow-adapter",
        "--adapter",
        world["adapter"],
        "--parent-index",
        world["sids"],
        "--sid-index",
        world["sids"],
        "--output_dir",
        tmp_path / "grown",
    ]


GROW = {
    "ground_steps_negative": (["--max_steps", "-1"], ["steps", "--max_steps", "-1"]),
    "batch_size_zero": (
        ["--per_device_train_batch_size", "0"],
        ["batch_size", "--per_device_train_batch_size", "positive integer"],
    ),
    "lr_zero": (["--learning_rate", "0"], ["learning_rate", "--learning_rate"]),
    "replay_negative": (["--replay", "-1"], ["replay must be >= 0", "--replay"]),
    "replay_nan": (["--replay", "nan"], ["replay must be >= 0", "nan"]),
}


@pytest.mark.parametrize("case", sorted(GROW))
def test_grow_adapter_refuses_a_grounding_setting_out_of_range(world, tmp_path, capsys, case):
    flags, words = GROW[case]
    before = snapshot(world["root"])
    line = refused(capsys, *grow_args(world, tmp_path), *flags)
    for word in words:
        assert word in line, (word, line)
    assert not (tmp_path / "grown").exists()
    assert snapshot(world["root"]) == before


def test_add_items_refuses_a_zero_batch_size(world, tmp_path, capsys):
    line = refused(
        capsys,
        "add-items",
        "--sid-index",
        world["sids"],
        "--catalogue",
        world["catalogue"],
        "--encoder",
        f"lm:{world['base']}",
        "--encode-batch-size",
        "0",
        "--output_dir",
        tmp_path / "v2",
    )
    assert "batch_size must be a positive integer" in line and "--encode-batch-size" in line
    assert not (tmp_path / "v2").exists()


DIAGNOSE = {
    "n_sid_zero": (["--n-sid", "0"], ["n_sid", "--n-sid"]),
    "purity_m_zero": (["--purity-m", "0"], ["purity_m", "--purity-m"]),
    "r2_q_zero": (["--r2-q", "0"], ["r2_q", "--r2-q"]),
    "nearest_k_zero": (["--nearest-k", "0"], ["nearest_k", "--nearest-k"]),
    "n_text_negative": (["--n-text", "-1"], ["n_text", ">= 0"]),
    "category_depth_negative": (["--category-depth", "-1"], ["category_depth", "--category-depth"]),
}


@pytest.mark.parametrize("case", sorted(DIAGNOSE))
def test_diagnose_refuses_a_report_setting_out_of_range(world, tmp_path, capsys, case):
    flags, words = DIAGNOSE[case]
    line = refused(
        capsys,
        "diagnose",
        world["adapter"],
        "--sid-index",
        world["sids"],
        "--output_dir",
        tmp_path / "r",
        *flags,
    )
    for word in words:
        assert word in line, (word, line)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--strategies", "bogus"], ["Unknown strategy 'bogus'", "centroid_gti"]),
        (["--seeds", "-1"], ["seed", "--seeds", "between 0 and"]),
    ],
    ids=["unknown_strategy", "negative_seed"],
)
def test_demo_refuses_bad_choices_before_building_sids(world, tmp_path, capsys, flags, words):
    line = refused(
        capsys,
        "demo",
        "--preset",
        "smoke",
        "--model_name_or_path",
        world["base"],
        "--output_dir",
        tmp_path / "demo",
        *flags,
    )
    for word in words:
        assert word in line, (word, line)
    assert not (tmp_path / "demo").exists()  # refused before the folder, the catalogue or the SIDs


def test_the_python_api_refuses_the_same_values():
    """The checks are the settings' own, not the command line's."""
    from peft_grounded.checks import SettingsError
    from peft_grounded.evaluation import EvalSettings
    from peft_grounded.pipeline import Budget
    from peft_grounded.sids.quantizers import QuantizationError, RQKMeansConfig
    from peft_grounded.training.stage_config import GroundingConfig

    with pytest.raises(SettingsError, match=r"max_steps .* got -5"):
        GroundingConfig(output_dir="unused", max_steps=-5, use_cpu=True)
    with pytest.raises(SettingsError, match="gradient_accumulation_steps must be a positive integer"):
        GroundingConfig(output_dir="unused", max_steps=2, gradient_accumulation_steps=0, use_cpu=True)
    with pytest.raises(
        SettingsError,
        match=r"batch_size must be a positive integer, got 0 \(--per_device_train_batch_size\); gradient_accumulation",
    ):
        Budget.from_training(
            dict(per_device_train_batch_size=0, gradient_accumulation_steps=0)
        )  # every problem
    with pytest.raises(SettingsError, match="r must be a positive integer"):
        Budget(lora={"r": 0, "target_modules": "all-linear"})
    with pytest.raises(SettingsError, match="max_steps must be a positive number"):
        Budget.from_training(sft=dict(max_steps=0))  # no time budget: a zero step count would train nothing
    timed = Budget.from_training(sft=dict(max_steps=0, max_minutes=1.0))
    assert (
        timed.sft.max_steps == 0 and timed.record()["sft"]["max_steps"] == 0
    )  # with one, 0 means "the time alone"
    with pytest.raises(SettingsError, match="users must be a positive integer or None"):
        EvalSettings(users=0)
    with pytest.raises(QuantizationError, match="max_iter must be a positive integer"):
        RQKMeansConfig(max_iter=-3)
    assert not (GroundingConfig(output_dir="unused", max_steps=-1, use_cpu=True).max_steps > 0)  # epochs
