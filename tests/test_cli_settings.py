"""The stage commands' settings: one set of dataclasses drives Python, the command line and a YAML file; every
SFTConfig field is a flag under its own name, the flags of earlier releases stay as aliases; ``--help`` comes
from a cache that matches the installed libraries and never imports torch."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
from toy_catalogue import toy_catalogue, toy_index

from peft_grounded.cli import ground, help, main, sft
from peft_grounded.cli.common import ModelArguments, SFTArguments
from peft_grounded.grounding import GroundingConfig
from peft_grounded.recommend import RecommendationConfig


def _as_dict(settings) -> list[dict]:
    """Comparable contents of parsed settings (SFTConfig's to_dict masks tokens, turns enums into values)."""
    return [s.to_dict() if hasattr(s, "to_dict") else dataclasses.asdict(s) for s in settings]


SFT_FLAGS = [
    "--sid_index", "sids", "--model_name_or_path", "base", "--init", "centroid", "--objective", "sequence",
    "--lora_r", "4", "--output_dir", "out", "--learning_rate", "0.002", "--max_steps", "30",
    "--warmup_ratio", "0.1", "--weight_decay", "0.01", "--report_to", "none",
    "--per_device_train_batch_size", "8", "--bf16", "--max_length", "128",
]  # fmt: skip


def _python_sft():
    return (
        ModelArguments(sid_index="sids", model_name_or_path="base", init="centroid"),
        SFTArguments(objective="sequence", lora_r=4),
        RecommendationConfig(
            output_dir="out",
            learning_rate=0.002,
            max_steps=30,
            warmup_ratio=0.1,
            weight_decay=0.01,
            report_to="none",
            per_device_train_batch_size=8,
            bf16=True,
            max_length=128,
        ),
    )


def test_one_settings_object_from_python_cli_and_yaml(tmp_path):
    python = _python_sft()
    cli = sft.parse(SFT_FLAGS)
    yaml_file = tmp_path / "sft.yaml"
    keys = dict(zip(SFT_FLAGS[::2], SFT_FLAGS[1::2], strict=False))
    lines = [f"{k.removeprefix('--')}: {v}" for k, v in keys.items() if k != "--bf16"]
    yaml_file.write_text("\n".join([*lines, "bf16: true", "max_length: 128"]) + "\n")
    from_yaml = sft.parse(["--config", str(yaml_file)])
    assert [type(s) for s in cli] == [ModelArguments, SFTArguments, RecommendationConfig]
    assert _as_dict(python) == _as_dict(cli) == _as_dict(from_yaml)
    # the command line overrides the file
    overridden = sft.parse(["--config", str(yaml_file), "--learning_rate", "0.5"])
    assert overridden[2].learning_rate == 0.5 and overridden[2].max_steps == 30


def test_every_sft_config_field_is_a_flag_and_old_flags_are_aliases():
    from trl import SFTConfig

    options = {s for action in sft.parser()._actions for s in action.option_strings}
    fields = [f.name for f in dataclasses.fields(SFTConfig) if f.init]
    assert not [name for name in fields if f"--{name}" not in options]
    old = [
        "--sid-index", "sids", "--output", "o", "--steps", "7", "--lr", "0.1", "--batch-size", "4",
        "--grad-accum", "2", "--minutes", "3", "--lr-scheduler", "linear", "--max-length", "96",
        "--save-steps", "5", "--seed", "3", "--resume", "--model", "base", "--weights-dtype", "bfloat16",
        "--lora-r", "2", "--lora-target-modules", "q_proj,v_proj", "--max-history", "4", "--with-titles",
    ]  # fmt: skip
    new = [
        "--sid_index", "sids", "--output_dir", "o", "--max_steps", "7", "--learning_rate", "0.1",
        "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2", "--max_minutes", "3",
        "--lr_scheduler_type", "linear", "--max_length", "96", "--save_steps", "5", "--seed", "3",
        "--resume_from_checkpoint", "last", "--model_name_or_path", "base", "--weights_dtype", "bfloat16",
        "--lora_r", "2", "--lora_target_modules", "q_proj,v_proj", "--max_history", "4", "--with_titles",
    ]  # fmt: skip
    assert _as_dict(sft.parse(old)) == _as_dict(sft.parse(new))
    model, args, config = sft.parse(old)
    assert (
        config.resume is True
        and model.dtype.is_floating_point
        and args.lora()["target_modules"] == ["q_proj", "v_proj"]
    )


def test_stage_defaults_are_the_configs_own():
    """No second set of defaults in the command line: a bare command gives the dataclasses' defaults."""
    model, config = ground.parse(["--sid-index", "s", "--output", "o"])
    assert _as_dict([config]) == _as_dict([GroundingConfig(output_dir="o")])
    assert config.max_steps == 200 and config.learning_rate == 1e-3
    assert RecommendationConfig(output_dir="o").max_steps == 400
    assert GroundingConfig(output_dir="o", max_minutes=2).max_steps == -1  # time alone, as --minutes gave
    assert model == ModelArguments(sid_index="s")


def test_bad_settings_fail_at_parse_time():
    with pytest.raises(SystemExit):  # argparse: a choice that does not exist
        sft.parse(["--sid-index", "s", "--objective", "chat"])
    from peft_grounded.cli import evaluate

    with pytest.raises(ValueError, match="splits"):
        evaluate.parse(["--adapter", "a", "--sid-index", "s", "--output", "o", "--splits", "train"])
    with pytest.raises(ValueError, match="num_beams"):
        evaluate.parse(["--adapter", "a", "--sid-index", "s", "--output", "o", "--num-beams", "0"])


@pytest.mark.parametrize("command", sorted(help.SOURCES))
def test_shipped_help_matches_the_installed_libraries(command):
    """The snapshot that --help prints is what the installed TRL renders; regenerate it with
    ``python -m peft_grounded.cli.help`` after changing the settings or upgrading TRL/transformers/PEFT."""
    first, _, text = (help.SNAPSHOTS / f"{command}.txt").read_text().partition("\n")
    assert first == help.KEY_PREFIX + help.help_key(command), (
        "stale snapshot: python -m peft_grounded.cli.help"
    )
    assert text == help.render(command)


def test_help_lists_sft_config_fields_without_importing_torch():
    """Every command's --help (and the command list) in one fresh process, which never imports torch or TRL."""
    code = (
        "import contextlib, io, sys\n"
        "from peft_grounded.cli import build_parser, main\n"
        "names = [None, *build_parser()._subparsers._group_actions[0].choices]\n"
        "for name in names:\n"
        "    if name == 'recommend':  # no snapshot: its TRL parser renders its help (tests/test_serving.py)\n"
        "        continue\n"
        "    with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
        "        main([name, '--help'] if name else ['--help'])\n"
        "main(['sft', '--help'])\n"
        "print('COMMANDS', len(names) - 1)\n"
        "assert 'torch' not in sys.modules and 'trl' not in sys.modules, 'help imported torch'"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert (
        "COMMANDS 11" in out.stdout
    )  # build-sids, add-items, grow-adapter, ground, sft, evaluate, recommend, diagnose, push, pull, demo
    flags = ("--learning_rate", "--warmup_ratio", "--weight_decay", "--report_to", "--output_dir", "--lora_r")
    for flag in (*flags, "--per_device_train_batch_size", "--objective"):
        assert flag in out.stdout


def test_help_renders_once_into_the_user_cache_when_no_snapshot_fits(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PEFT_GROUNDED_CACHE", str(tmp_path))
    monkeypatch.setattr(help, "SNAPSHOTS", tmp_path / "no-snapshots")
    assert main(["ground", "--help"]) == 0
    cached = list((tmp_path / "help").glob("ground-*.txt"))
    assert len(cached) == 1 and capsys.readouterr().out == help.render("ground")
    cached[0].write_text(cached[0].read_text().replace("Learning rate of the new rows.", "CACHED TEXT"))
    assert main(["ground", "-h"]) == 0
    assert "CACHED TEXT" in capsys.readouterr().out  # read back, not rendered again


@pytest.fixture
def stage_data(tmp_path, tiny_model_factory, tokenizer):
    base = tmp_path / "base"
    tiny_model_factory("llama", False).save_pretrained(base)
    tokenizer.save_pretrained(base)
    catalogue = toy_catalogue()
    toy_index(catalogue).save(tmp_path / "sids")
    items = {
        i: {"title": it.title, "categories": ", ".join(it.categories)} for i, it in catalogue.items.items()
    }
    (tmp_path / "toy.item.json").write_text(json.dumps(items))
    (tmp_path / "toy.inter.json").write_text(json.dumps({u: list(s) for u, s in catalogue.sequences.items()}))
    return {
        "model_name_or_path": str(base),
        "sid_index": str(tmp_path / "sids"),
        "catalogue": str(tmp_path / "toy"),
    }


def test_a_yaml_config_runs_a_stage(tmp_path, stage_data):
    settings = {**stage_data, "output_dir": str(tmp_path / "g"), "max_steps": 2, "learning_rate": 0.01,
                "per_device_train_batch_size": 4, "save_steps": 2, "max_length": 96, "init": "centroid"}  # fmt: skip
    path = tmp_path / "ground.yaml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in settings.items()))
    assert main(["ground", "--config", str(path)]) == 0
    manifest = json.loads((tmp_path / "g" / "run.json").read_text())
    assert (manifest["max_steps"], manifest["learning_rate"], manifest["per_device_train_batch_size"]) == (
        2,
        0.01,
        4,
    )
    assert (tmp_path / "g" / "adapter" / "adapter_model.safetensors").is_file()


@pytest.mark.parametrize(
    ("command", "required"),
    [
        ("build-sids", []),
        ("add-items", ["--sid-index", "s", "--catalogue", "c"]),
        ("grow-adapter", ["--adapter", "a", "--parent-index", "p", "--sid-index", "s"]),
        ("diagnose", ["--sid-index", "s", "a"]),
        ("demo", []),
    ],
)
def test_every_command_names_its_output_folder_output_dir(command, required):
    """One name for the output folder across commands (as TRL's output_dir); the old flags stay aliases."""
    from peft_grounded.cli import build_parser

    old = {"diagnose": "--out", "demo": "--output"}.get(command, "-o")
    for flag in ("--output_dir", "--output-dir", old):
        assert build_parser().parse_args([command, *required, flag, "out"]).output_dir == "out"
