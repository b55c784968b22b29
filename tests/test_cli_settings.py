"""Every command's settings: one set of dataclasses drives Python, the command line and a YAML file; every
SFTConfig and ModelConfig field is a flag under its own name (also dashed), and no other name is taken;
``--help`` of a command whose settings are light never imports torch, transformers or the trainers."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
from helpers.toy_catalogue import toy_catalogue, toy_index

from peft_grounded.cli import COMMANDS, command, ground, main, sft
from peft_grounded.cli.common import DataArguments, SFTArguments
from peft_grounded.cli.model_config import GroundedModelConfig, LoraModelConfig
from peft_grounded.sids.extended_base import RowStart
from peft_grounded.training.sft import RecommendationConfig
from peft_grounded.training.stage_config import GroundingConfig


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
        DataArguments(sid_index="sids"),
        RowStart(init="centroid"),
        SFTArguments(objective="sequence"),
        LoraModelConfig(model_name_or_path="base", lora_r=4),
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
    types = [DataArguments, RowStart, SFTArguments, LoraModelConfig, RecommendationConfig]
    assert [type(s) for s in cli] == types
    assert _as_dict(python) == _as_dict(cli) == _as_dict(from_yaml)
    # the command line overrides the file
    overridden = sft.parse(["--config", str(yaml_file), "--learning_rate", "0.5"])
    assert overridden[4].learning_rate == 0.5 and overridden[4].max_steps == 30


def test_every_sft_and_model_config_field_is_a_flag_in_both_spellings():
    from trl import ModelConfig, SFTConfig

    options = {s for action in sft.parser()._actions for s in action.option_strings}
    fields = [f.name for cls in (SFTConfig, ModelConfig) for f in dataclasses.fields(cls) if f.init]
    assert not [name for name in fields if f"--{name}" not in options]
    dashed = [
        "--sid-index", "sids", "--output-dir", "o", "--max-steps", "7", "--learning-rate", "0.1",
        "--per-device-train-batch-size", "4", "--gradient-accumulation-steps", "2", "--max-minutes", "3",
        "--lr-scheduler-type", "linear", "--max-length", "96", "--save-steps", "5", "--seed", "3",
        "--resume-from-checkpoint", "--model-name-or-path", "base", "--dtype", "bfloat16",
        "--lora-r", "2", "--lora-target-modules", "q_proj,v_proj", "--max-history", "4", "--with-titles",
    ]  # fmt: skip
    new = [
        "--sid_index", "sids", "--output_dir", "o", "--max_steps", "7", "--learning_rate", "0.1",
        "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2", "--max_minutes", "3",
        "--lr_scheduler_type", "linear", "--max_length", "96", "--save_steps", "5", "--seed", "3",
        "--resume_from_checkpoint", "last", "--model_name_or_path", "base", "--dtype", "bfloat16",
        "--lora_r", "2", "--lora_target_modules", "q_proj", "v_proj", "--max_history", "4", "--with_titles",
    ]  # fmt: skip
    assert _as_dict(sft.parse(dashed)) == _as_dict(sft.parse(new))
    _, _, _, base, config = sft.parse(dashed)
    assert config.resume is True and base.dtype == "bfloat16" and base.torch_dtype().is_floating_point
    assert base.lora()["target_modules"] == ["q_proj", "v_proj"]  # commas or spaces (ModelConfig's)
    assert sft.parse(["--sid-index", "s"])[3].lora()["target_modules"] == "all-linear"


@pytest.mark.parametrize(
    "flags",
    [["--sids", "s"], ["--out", "o"], ["--output", "o"], ["--steps", "7"], ["--lr", "0.1"], ["--batch-size", "4"],
     ["--grad-accum", "2"], ["--minutes", "3"], ["--lr-scheduler", "linear"], ["--resume"], ["--model", "base"],
     ["--weights-dtype", "bfloat16"], ["--max_step", "7"]],
)  # fmt: skip
def test_no_flag_but_a_fields_own_name_is_taken(flags):
    """Short names, other names and abbreviations of a field's flag are refused, not guessed."""
    with pytest.raises((SystemExit, ValueError)):
        sft.parse(["--sid_index", "s", *flags])


def test_stage_defaults_are_the_configs_own():
    """No second set of defaults in the command line: a bare command gives the dataclasses' defaults."""
    data, start, base, config = ground.parse(["--sid-index", "s", "--output_dir", "o"])
    assert _as_dict([config]) == _as_dict([GroundingConfig(output_dir="o")])
    assert config.max_steps == 200 and config.learning_rate == 1e-3
    assert RecommendationConfig(output_dir="o").max_steps == 400
    assert GroundingConfig(output_dir="o", max_minutes=2).max_steps == -1  # time alone
    assert data == DataArguments(sid_index="s") and start == RowStart() and base == GroundedModelConfig()


def test_bad_settings_fail_at_parse_time():
    with pytest.raises(SystemExit):  # argparse: a choice that does not exist
        sft.parse(["--sid-index", "s", "--objective", "chat"])
    from peft_grounded.cli import evaluate

    with pytest.raises(ValueError, match="splits"):
        evaluate.parse(["--adapter", "a", "--sid-index", "s", "--output_dir", "o", "--splits", "train"])
    with pytest.raises(ValueError, match="num_beams"):
        evaluate.parse(["--adapter", "a", "--sid-index", "s", "--output_dir", "o", "--num-beams", "0"])
    with pytest.raises(ValueError, match="leave out --use_peft"):
        ground.parse(["--sid-index", "s", "--use_peft"])
    with pytest.raises(ValueError, match="load_in_4bit"):
        sft.parse(["--sid-index", "s", "--load_in_4bit"])
    for stage in (sft, ground):
        with pytest.raises(ValueError, match=r"init_scale must be a finite number > 0.*--init_scale"):
            stage.parse(["--sid-index", "s", "--init", "centroid", "--init-scale", "0"])
    with pytest.raises(ValueError, match=r"RowStart: init_scale must be a finite number > 0.*--init_scale"):
        RowStart(init_scale=0)


@pytest.mark.parametrize("stage", [sft, ground])
def test_the_parsed_row_start_reaches_sid_model_as_it_is(stage, tmp_path, monkeypatch):
    """One settings object from the flags to the model: the RowStart the command parsed is the one sid_model
    gets (no repacking on the way down), beside the base and its dtype."""
    import torch

    import peft_grounded.cli.common as common
    import peft_grounded.sids.extended_base as sid_models

    catalogue = toy_catalogue()
    monkeypatch.setattr(common, "load_data", lambda *_: (catalogue, toy_index(catalogue)))
    seen = {}

    class Reached(Exception):
        pass

    def fake_sid_model(model_path, index, **kwargs):
        seen.update(kwargs, model_path=model_path)
        raise Reached

    monkeypatch.setattr(sid_models, "sid_model", fake_sid_model)
    base, out = str(tmp_path / "base"), str(tmp_path / "o")
    flags = ["--sid-index", "s", "--init", "centroid", "--init_scale", "0.1", "--centroid_variant"]
    flags += ["codebook", "--model_name_or_path", base, "--dtype", "bfloat16", "--output_dir", out]
    settings = stage.parse(flags)
    parsed = next(s for s in settings if isinstance(s, RowStart))
    assert parsed == RowStart(init="centroid", centroid_variant="codebook", init_scale=0.1)
    with pytest.raises(Reached):
        stage.COMMAND.run(*settings)
    assert seen["start"] is parsed and type(seen["start"]) is RowStart
    assert (seen["model_path"], seen["dtype"]) == (base, torch.bfloat16)


LIGHT = (
    "build-sids",
    "add-items",
    "grow-adapter",
    "evaluate",
    "recommend",
    "diagnose",
    "push",
    "pull",
    "demo",
)


def test_help_of_light_commands_imports_neither_torch_nor_transformers():
    """The command list and every light command's --help in one fresh process: no torch, no transformers (TRL's
    parser loads without them), so they answer in well under a second (benchmarks/bench_cli_help.py)."""
    code = (
        "import contextlib, io, sys\n"
        "from peft_grounded.cli import COMMANDS, main\n"
        f"for name in (None, *{LIGHT!r}):\n"
        "    with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
        "        main([name, '--help'] if name else ['--help'])\n"
        "with contextlib.suppress(SystemExit):\n"
        "    main(['diagnose', '--help'])\n"
        "print('COMMANDS', len(COMMANDS))\n"
        "heavy = [m for m in ('torch', 'transformers', 'peft') if m in sys.modules]\n"
        "assert not heavy, heavy"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert "COMMANDS 12" in out.stdout
    for flag in (
        "--sid_index",
        "--sid-index",
        "--output_dir",
        "--output-dir",
        "--config FILE.yaml",
        "--dry-run",
        "ADAPTERS",
    ):
        assert flag in out.stdout


def test_stage_command_help_lists_the_config_fields(capsys):
    with pytest.raises(SystemExit):
        main(["sft", "--help"])
    out = capsys.readouterr().out
    for flag in (
        "--learning_rate",
        "--warmup_ratio",
        "--report_to",
        "--output_dir",
        "--lora_r",
        "--objective",
    ):
        assert flag in out
    assert "--per_device_train_batch_size" in out and "--dtype" in out


def test_one_meaning_per_flag_name_across_commands():
    """A flag name that several commands take means one thing: --per_device_train_batch_size is a training batch
    (sft, ground, grow-adapter); the encoder's and the decoder's batches have their own names."""
    dests: dict[str, set[str]] = {}
    for name in COMMANDS:
        for action in command(name).parser()._actions:
            for option in action.option_strings:
                dests.setdefault(option, set()).add(action.dest)
    assert dests["--per_device_train_batch_size"] == {"per_device_train_batch_size"}
    assert dests["--encode-batch-size"] == {"encode_batch_size"} and "--decode-batch-size" in dests
    clashes = {option: d for option, d in dests.items() if len(d) > 1}
    assert not clashes and "--batch-size" not in dests and "--batch_size" not in dests


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_reads_a_yaml_config(tmp_path, name):
    required = {
        "build-sids": {"output_dir": "o"},
        "add-items": {"sid_index": "p", "catalogue": "c", "output_dir": "o"},
        "grow-adapter": {"adapter": "a", "parent_index": "p", "sid_index": "s", "output_dir": "o"},
        "ground": {"sid_index": "s"},
        "sft": {"sid_index": "s"},
        "fuse-peer": {"adapter": "a", "sid_index": "s"},
        "evaluate": {"adapter": "a", "sid_index": "s", "output_dir": "o"},
        "recommend": {"adapter": "a", "history": "1,2"},
        "diagnose": {"sid_index": "s", "output_dir": "o", "adapters": ["a", "b"]},
        "push": {"adapter_dir": "a", "repo_id": "u/r"},
        "pull": {"repo_id": "u/r", "output_dir": "o"},
        "demo": {"output_dir": "o"},
    }[name]
    path = tmp_path / "settings.yaml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in required.items()))
    from_yaml = command(name).parse(["--config", str(path)])
    flags = [x for k, v in required.items() for x in (f"--{k}", *(v if isinstance(v, list) else [v]))]
    assert _as_dict(from_yaml) == _as_dict(command(name).parse(flags))


def test_operands_without_their_flags(capsys):
    push = command("push").parse(["adapter", "user/repo", "--private"])[0]
    assert (push.adapter_dir, push.repo_id, push.private) == ("adapter", "user/repo", True)
    pull = command("pull").parse(["user/repo", "out"])[0]
    assert (pull.repo_id, pull.output_dir) == ("user/repo", "out")
    diagnose = command("diagnose").parse(
        ["a", "b", "--sid-index", "s", "--output_dir", "o", "--name", "x", "--name", "y"]
    )
    assert (diagnose[0].adapters, diagnose[0].name) == (["a", "b"], ["x", "y"])
    with pytest.raises(ValueError, match="repo_id"):
        command("push").parse(["adapter"])
    assert main(["demo", "--strategies", "mean,gti", "--dry-run"]) == 0
    assert "settings OK" in capsys.readouterr().out


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
    ("name", "required"),
    [
        ("build-sids", []),
        ("add-items", ["--sid-index", "s", "--catalogue", "c"]),
        ("grow-adapter", ["--adapter", "a", "--parent-index", "p", "--sid-index", "s"]),
        ("diagnose", ["--sid-index", "s", "a"]),
        ("demo", []),
    ],
)
def test_every_command_names_its_output_folder_output_dir(name, required):
    """One name for the output folder across commands (as TRL's output_dir), in either spelling."""
    for flag in ("--output_dir", "--output-dir"):
        assert command(name).parse([*required, flag, "out"])[0].output_dir == "out"
    for removed in ("--output", "--out", "-o"):
        with pytest.raises((SystemExit, ValueError)):
            command(name).parse([*required, removed, "out"])


def test_the_cpu_recipe_sets_defaults_that_the_flags_given_and_config_override(tmp_path):
    from peft_grounded.recipes import CPU

    settings = sft.parse(["--sid-index", "s", "--recipe", "cpu"])
    for part in settings:  # each dataclass holds the recipe's partial instance of it
        assert {k: getattr(part, k) for k in CPU.of(type(part))} == CPU.of(type(part))
    values = {k: v for s in settings for k, v in vars(s).items()}
    assert {k: values[k] for k in CPU.values()} == dict(CPU.values()) and values["recipe"] == "cpu"
    plain = {k: v for s in sft.parse(["--sid-index", "s"]) for k, v in vars(s).items()}
    assert plain["objective"] == "prompt" and plain["layers"] == 0 and plain["init"] == "mean"  # no recipe
    given = sft.parse(["--sid-index", "s", "--recipe=cpu", "--learning_rate", "1e-3", "--layers", "4"])
    assert (given[4].learning_rate, given[3].layers, given[2].objective) == (1e-3, 4, "sequence")
    path = tmp_path / "sft.yaml"
    path.write_text("sid_index: s\nrecipe: cpu\nlora_r: 4\n")
    from_yaml = sft.parse(["--config", str(path)])
    assert (from_yaml[3].lora_r, from_yaml[3].layers, from_yaml[1].init) == (4, 8, "centroid")
    with pytest.raises(ValueError, match=r"--recipe 'gpu' is unknown; choose one of cpu"):
        sft.parse(["--sid-index", "s", "--recipe", "gpu"])


def test_the_cpu_recipe_is_the_demos_default_preset():
    """One recipe: `sft --recipe cpu` trains as the demo does (its budget and the distillation teacher aside)."""
    from peft_grounded.pipeline import PRESETS
    from peft_grounded.recipes import CPU

    recipe, demo = CPU, PRESETS["default"]
    b, fmt = demo.budget, demo.prompt_format()
    assert (demo.layers, fmt.objective, fmt.max_history, b.start.init_scale) == (
        recipe["layers"],
        recipe["objective"],
        recipe["max_history"],
        recipe["init_scale"],
    )
    assert (b.lora["r"], b.lora["lora_alpha"]) == (recipe["lora_r"], recipe["lora_alpha"])
    assert (b.sft.learning_rate, b.sft.per_device_train_batch_size, b.sft.max_length) == (
        recipe["learning_rate"],
        recipe["per_device_train_batch_size"],
        recipe["max_length"],
    )
    # the demo's headline strategy starts the rows as the recipe does (then grounds them)
    from peft_grounded.pipeline.budget import strategy

    assert strategy(demo.headline).init == recipe["init"] and demo.headline in demo.strategies
    # the recipe distils from SASRec; the demo's 150 steps do not fit a teacher
    assert recipe["distill_weight"] == 0.5 and b.sft.distill_weight == 0
    from peft_grounded.recipes import CPU_SIDS
    from peft_grounded.sids.behaviour import ItemVectorsConfig

    sids = CPU_SIDS  # and the SIDs it trains on are build-sids --recipe cpu's
    assert (demo.levels, str(demo.codes)) == (sids["levels"], sids["codes"])
    assert demo.item_vectors == ItemVectorsConfig(**sids.of(ItemVectorsConfig))


def test_sft_layers_trains_on_the_first_blocks_of_the_base(tmp_path, stage_data, capsys):
    out = tmp_path / "s"
    flags = [f"--{k}={v}" for k, v in stage_data.items()]
    flags += [
        "--output_dir",
        str(out),
        "--max_steps",
        "1",
        "--per_device_train_batch_size",
        "4",
        "--max_length",
        "96",
    ]
    assert main(["sft", *flags, "--layers", "1", "--objective", "sequence"]) == 0
    cut = out / "base-1-blocks"
    assert json.loads((cut / "config.json").read_text())["num_hidden_layers"] == 1
    adapter = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(cut)
    assert main(["sft", *flags, "--output_dir", str(tmp_path / "t"), "--layers", "3"]) != 0
    assert "layers=3: the base has 2 decoder blocks; keep 1 to all" in capsys.readouterr().err
    with pytest.raises(ValueError, match="layers=-1"):
        sft.parse(["--sid-index", "s", "--layers", "-1"])


def test_the_hour_recipe_is_the_cpu_recipe_with_the_hours_levers():
    from peft_grounded.recipes import CPU, CPU_HOUR

    hour, cpu = CPU_HOUR.values(), CPU.values()
    assert {k: hour[k] for k in cpu} == dict(cpu)  # everything of cpu, untouched
    _, _, args, base, config = sft.parse(["--sid-index", "s", "--recipe", "cpu_hour"])
    assert (config.max_minutes, config.max_steps, base.lora_dropout) == (60.0, -1, 0.1)
    assert (config.augment_views, config.neftune_noise_alpha, config.distill_weight) == (1, 5.0, 0.5)
    assert (args.eval_every, args.eval_per_epoch, args.keep_best, args.eval_users) == (0, 1, True, None)
    _, _, given, _, _ = sft.parse(
        ["--sid-index", "s", "--recipe", "cpu_hour", "--eval_every", "500", "--eval_per_epoch", "0"]
    )
    assert (given.eval_every, given.eval_per_epoch) == (500, 0) and given.keep_best


def test_the_cpu_recipe_chooses_its_epochs_on_validation():
    _, _, args, _, _ = sft.parse(["--sid-index", "s", "--recipe", "cpu", "--max_minutes", "30"])
    assert (args.eval_per_epoch, args.keep_best, args.eval_every) == (1, True, 0)
    with pytest.raises(ValueError, match=r"over a recipe's --eval_per_epoch, add --eval_per_epoch 0"):
        sft.parse(["--sid-index", "s", "--recipe", "cpu", "--eval_every", "500"])


def test_keep_best_without_validation_points_is_refused():
    with pytest.raises(ValueError, match=r"--keep_best picks among validation points: give --eval_every N"):
        sft.parse(["--sid-index", "s", "--keep_best"])
    with pytest.raises(ValueError, match="eval_every"):
        sft.parse(["--sid-index", "s", "--eval_every", "-1"])
    with pytest.raises(ValueError, match="eval_users"):
        sft.parse(["--sid-index", "s", "--eval_every", "2", "--eval_users", "0"])
    with pytest.raises(ValueError, match="eval_per_epoch"):
        sft.parse(["--sid-index", "s", "--eval_per_epoch", "-1"])
    with pytest.raises(ValueError, match="--eval_every counts steps and --eval_per_epoch epochs: give one"):
        sft.parse(["--sid-index", "s", "--eval_every", "5", "--eval_per_epoch", "1"])
    _, _, args, _, _ = sft.parse(["--sid-index", "s", "--eval_per_epoch", "2", "--keep_best"])
    assert (args.eval_per_epoch, args.keep_best) == (2, True)


def test_sft_keep_best_over_epochs_decodes_validation_at_each_epoch_s_end(tmp_path, stage_data):
    """`sft --eval_per_epoch 1 --keep_best` over two epochs: a validation point at each epoch's last step, the
    adapter of the better one written."""
    out = tmp_path / "s"
    flags = [f"--{k}={v}" for k, v in stage_data.items()]
    flags += ["--output_dir", str(out), "--max_steps", "-1", "--num_train_epochs", "2"]
    flags += ["--per_device_train_batch_size", "4", "--max_length", "96", "--objective", "sequence"]
    flags += [
        "--learning_rate",
        "0.05",
        "--eval_per_epoch",
        "1",
        "--eval_users",
        "5",
        "--keep_best",
        "--logging_steps",
        "1",
    ]
    assert main(["sft", *flags]) == 0
    log = json.loads((out / "log_history.json").read_text())
    last = max(e["step"] for e in log)
    epochs = {e["step"]: e["epoch"] for e in log if "loss" in e}
    points = [e for e in log if "eval_recall@10" in e]
    assert last % 2 == 0 and [p["step"] for p in points] == [last // 2, last]
    assert epochs[last // 2] == pytest.approx(1.0) and epochs[last] == pytest.approx(2.0)
    (restored,) = [e for e in log if "restored_best_step" in e]
    assert restored["restored_best_step"] == max(points, key=lambda p: p["eval_recall@10"])["step"]


def test_sft_keep_best_over_epochs_resumes_after_a_kill(tmp_path, stage_data):
    """Killed after its first epoch's checkpoint, `sft --eval_per_epoch 1 --keep_best --resume_from_checkpoint`
    keeps that epoch's point, decodes the second epoch's end at the same step, and ends on the best of both."""
    import shutil

    out = tmp_path / "s"
    flags = [f"--{k}={v}" for k, v in stage_data.items()]
    flags += [
        "--output_dir",
        str(out),
        "--max_steps",
        "-1",
        "--num_train_epochs",
        "2",
        "--save_steps",
        "1",
        "--save_total_limit",
        "10",
    ]
    flags += ["--per_device_train_batch_size", "4", "--max_length", "96", "--objective", "sequence"]
    flags += ["--learning_rate", "0.05", "--eval_per_epoch", "1", "--eval_users", "5", "--keep_best"]
    assert main(["sft", *flags]) == 0
    whole = json.loads((out / "log_history.json").read_text())
    last = max(e["step"] for e in whole)
    shutil.rmtree(out / "adapter")
    for checkpoint in out.glob("checkpoint-*"):
        if int(checkpoint.name.split("-")[1]) > last // 2:
            shutil.rmtree(checkpoint)  # as if killed just after the first epoch's end
    assert (out / f"checkpoint-{last // 2}").is_dir()
    assert main(["sft", *flags, "--resume_from_checkpoint", "last"]) == 0
    log = json.loads((out / "log_history.json").read_text())
    points = [e for e in log if "eval_recall@10" in e]
    assert [p["step"] for p in points] == [last // 2, last]
    (restored,) = [e for e in log if "restored_best_step" in e]
    assert restored["restored_best_step"] == max(points, key=lambda p: p["eval_recall@10"])["step"]
    assert (out / "adapter" / "adapter_model.safetensors").is_file()


@pytest.mark.parametrize(
    "batches, accumulation, per_epoch, every", [(10, 1, 1, 10), (10, 2, 1, 5), (11, 2, 2, 3), (3, 1, 4, 1)]
)
def test_points_per_epoch_count_the_epoch_s_optimisation_steps(batches, accumulation, per_epoch, every):
    from types import SimpleNamespace

    from transformers import TrainerControl, TrainerState

    from peft_grounded.training.callbacks import ValidationRecall

    callback = ValidationRecall(lambda model: {}, 0, per_epoch=per_epoch)
    args = SimpleNamespace(gradient_accumulation_steps=accumulation)
    callback.on_train_begin(args, TrainerState(), TrainerControl(), train_dataloader=range(batches))
    assert callback.every == every
    with pytest.raises(ValueError, match="one of them"):
        ValidationRecall(lambda model: {}, 5, per_epoch=1)


def test_sft_keep_best_decodes_validation_and_ends_on_the_best_adapter(tmp_path, stage_data):
    """`sft --eval_every 1 --keep_best`: the validation users decoded at every step as `evaluate` decodes them;
    the adapter written is the snapshot of the best point, and the log names it."""
    import torch
    from safetensors.torch import load_file

    out = tmp_path / "s"
    flags = [f"--{k}={v}" for k, v in stage_data.items()]
    flags += ["--output_dir", str(out), "--max_steps", "3", "--per_device_train_batch_size", "4"]
    flags += ["--max_length", "96", "--objective", "sequence", "--learning_rate", "0.05", "--save_steps", "1"]
    assert main(["sft", *flags, "--eval_every", "1", "--eval_users", "5", "--keep_best"]) == 0
    log = json.loads((out / "log_history.json").read_text())
    points = [e for e in log if "eval_recall@10" in e]
    assert [p["step"] for p in points] == [1, 2, 3] and all(p["eval_users"] == 5 for p in points)
    (restored,) = [e for e in log if "restored_best_step" in e]
    best = max(points, key=lambda p: p["eval_recall@10"])  # the first of equals, as keep_best keeps it
    assert restored["restored_best_step"] == best["step"]
    assert restored["restored_best_recall@10"] == best["eval_recall@10"]
    saved = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    if best["step"] != 3:  # an earlier best: its snapshot is what was written
        kept = load_file(str(out / "best" / f"step-{best['step']}" / "adapter_model.safetensors"))
        assert all(torch.equal(saved[k], kept[k]) for k in saved)


def test_build_sids_recipe_cpu_builds_from_behaviour_and_flags_win():
    from peft_grounded.recipes import CPU_SIDS

    parsed = command("build-sids").parse(["--output_dir", "s", "--recipe", "cpu"])
    values = {k: v for s in parsed for k, v in vars(s).items()}
    assert {k: values[k] for k in CPU_SIDS.values()} == dict(CPU_SIDS.values())
    plain = {k: v for s in command("build-sids").parse(["--output_dir", "s"]) for k, v in vars(s).items()}
    assert plain["item_vectors"] == "text" and plain["codes"] == "256"
    given = {k: v for s in command("build-sids").parse(["--output_dir", "s", "--recipe", "cpu", "--item_vectors", "mix"])
             for k, v in vars(s).items()}  # fmt: skip
    assert (given["item_vectors"], given["codes"]) == ("mix", "64")


def test_every_recipe_is_a_partial_instance_of_its_commands_settings():
    """A recipe names its command's dataclasses, their fields and values of their types; anything else is refused
    when the command builds its parser (and so before any parse, --help included)."""
    from peft_grounded import recipes
    from peft_grounded.recipes import CPU, Recipe

    assert {(r.command, r.name) for r in recipes.RECIPES} == {
        ("build-sids", "cpu"),
        ("sft", "cpu"),
        ("sft", "cpu_hour"),
    }
    for recipe in recipes.RECIPES:
        recipe.check(command(recipe.command).settings())
    classes = sft.settings()
    for bad, said in (
        ({"RowStrat": {"init_scale": 0.1}}, "RowStrat is not a settings dataclass of it"),
        ({"RowStart": {"init_scal": 0.1}}, "RowStart has no field 'init_scal'"),
        ({"RowStart": {"init_scale": "0.1"}}, r"RowStart.init_scale='0.1' is not a"),
        ({"RowStart": {"init": "centre"}}, "RowStart.init='centre' is not a"),
        ({"SFTArguments": {"keep_best": 1}}, "SFTArguments.keep_best=1 is not a"),
    ):
        with pytest.raises(ValueError, match=said):
            Recipe("bad", "sft", "a typo", bad).check(classes)
    with pytest.raises(ValueError, match="is set for RowStart and SFTArguments"):
        Recipe(
            "twice",
            "sft",
            "one flag, two fields",
            {"RowStart": {"init": "mean"}, "SFTArguments": {"init": 1}},
        )
    with pytest.raises(ValueError, match="extends 'cpu' of sft"):
        Recipe("other", "build-sids", "", {}, base=CPU)
    assert CPU["init_scale"] == 0.1 and CPU.of(RowStart) == {"init": "centroid", "init_scale": 0.1}
    with pytest.raises(KeyError, match="sets no 'seed'"):
        CPU["seed"]


def test_the_recipes_help_and_docs_are_rendered_from_the_recipes(capsys):
    """The --recipe help of each command and docs/cli.md's table are the recipes' own rendering: a recipe's
    values are written once, in peft_grounded.recipes."""
    from pathlib import Path

    from peft_grounded import recipes

    docs = Path(__file__).resolve().parent.parent / "docs" / "cli.md"
    text = docs.read_text(encoding="utf-8")
    assert recipes.render_into(text) == text, "run: python -m peft_grounded.recipes docs/cli.md"
    assert recipes.markdown() in text
    for recipe in recipes.RECIPES:
        assert recipe.flags(own=recipe.base is not None) in recipes.markdown()
    help_of = {name: command(name).parser().format_help() for name in ("sft", "build-sids")}
    flat = {name: " ".join(text.split()) for name, text in help_of.items()}
    assert "cpu = chosen on validation per CPU minute" in flat["sft"]
    assert "--init_scale 0.1" in flat["sft"] and "--recipe cpu + --max_minutes 60" in flat["sft"]
    assert "--levels 3 --codes 64 --item_vectors behaviour" in flat["build-sids"]
    with pytest.raises(ValueError, match="--recipe 'cpu_hour' is unknown; choose one of cpu"):
        command("build-sids").parse(["--output_dir", "s", "--recipe", "cpu_hour"])  # an sft recipe only


def test_fuse_peer_refuses_a_reference_weight_that_is_not_a_positive_number():
    args = command("fuse-peer").parse(["--adapter", "a", "--sid_index", "s"])[0]
    assert args.reference_weight == 1.0 and 1.0 in args.weights
    for bad in ("0", "-1", "inf"):
        with pytest.raises(ValueError, match="--reference_weight is a number > 0"):
            command("fuse-peer").parse(["--adapter", "a", "--sid_index", "s", "--reference_weight", bad])


def test_a_command_parses_the_arguments_it_is_given_and_no_args_file(tmp_path, monkeypatch):
    """transformers' parser would also read ``<the running program>.args`` (beside the user's script calling
    ``main``, beside pytest's ``__main__.py``) and put its flags first: flags nobody gave, and an error where
    that folder cannot be entered (a child running as another user, the repository in a 0700 folder)."""
    script = tmp_path / "my_script.py"
    script.write_text("")
    (tmp_path / "my_script.args").write_text("--learning_rate 0.5 --no_such_flag 1\n")
    monkeypatch.setattr(sys, "argv", [str(script)])
    *_, config = sft.parse(["--sid-index", "s"])
    assert config.learning_rate == RecommendationConfig.__dataclass_fields__["learning_rate"].default
