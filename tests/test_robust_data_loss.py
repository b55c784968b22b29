"""The six ways the commands lost a user's work (issue 22), each through the command line: two build-sids or
two trainings into one folder, a README replaced by TRL's card, evaluate/diagnose writing over a run's
metrics, ``--resume_from_checkpoint`` training a finished run again, and ``grow-adapter --overwrite`` deleting
the folder. Each asserts a clear message and that every byte the user had is still there."""

from __future__ import annotations

import json
import logging
import os

import pytest
from helpers.forked import limit_file_size, run, start, wait_for
from helpers.growth_fixtures import grow, grow_world
from helpers.robust_faults import TINY, fresh_tokenizer, ground_args, make_world, snapshot

from peft_grounded._io import lock_path
from peft_grounded.cli import main
from peft_grounded.sids import SIDIndex
from peft_grounded.training.runs import checkpoint_problem

pytestmark = pytest.mark.multiproc


@pytest.fixture
def world(tmp_path, tokenizer, tiny_model_factory):
    """The grow-adapter world (see growth_fixtures.grow_world)."""
    return grow_world(tmp_path, tokenizer, tiny_model_factory)


@pytest.fixture(scope="module")
def cli_world(tmp_path_factory):
    return make_world(tmp_path_factory.mktemp("world"), fresh_tokenizer())


@pytest.fixture(scope="module")
def strategy_run(cli_world, tmp_path_factory):
    """A finished strategy run (the runner's folder: run.json, metrics.json, curve.json, stage adapters)."""
    from helpers.toy_catalogue import toy_catalogue

    from peft_grounded.pipeline import Budget, Experiment, run_strategy
    from peft_grounded.prompts import PromptFormat

    catalogue = toy_catalogue()
    experiment = Experiment(
        cli_world["base"],
        catalogue,
        SIDIndex.load(cli_world["root"] / "sids"),
        fmt=PromptFormat(objective="sequence", max_history=4),
    )
    from peft_grounded.evaluation import EvalSettings

    budget = Budget.from_training(
        dict(per_device_train_batch_size=4, max_length=96, logging_steps=1, save_steps=2, disable_tqdm=True),
        sft=dict(max_steps=2),
        lora=dict(r=2, target_modules=["q_proj"]),
        evaluation=EvalSettings(users=4, num_beams=10, ks=(1, 5, 10)),
        eval_parts=("test",),
    )
    out = tmp_path_factory.mktemp("strategy") / "mean-seed0"
    record = run_strategy("mean", experiment, budget, out)
    return {"out": out, "record": record, "experiment": experiment, "budget": budget}


def cli(*argv: str) -> int:
    return main(list(argv))


# --- 1. two build-sids into one folder ------------------------------------------------------------------


def test_two_build_sids_into_one_folder_the_second_is_refused_and_the_first_index_kept(
    cli_world, tmp_path, capsys
):
    out, cache = tmp_path / "sids", tmp_path / "cache"
    catalogue = str(cli_world["root"] / "toy")
    argv = [
        "build-sids",
        "--catalogue",
        catalogue,
        "--codes",
        "4",
        "--levels",
        "2",
        "--cache-dir",
        str(cache),
    ]
    first = start(cli, *argv, "--seed", "0", "--output_dir", str(out), "--no-progress")
    wait_for(lock_path(out).exists, child=first)  # the first build is running (encoding, clustering)
    assert cli(*argv, "--seed", "1", "--output_dir", str(out), "--no-progress") == 2
    err = capsys.readouterr().err
    assert f"{out.resolve()} is being written by another peft-grounded process (pid {first.pid}" in err
    assert first.wait(300) == 0, first.err[-3000:]
    assert SIDIndex.load(out).build_config["seed"] == 0  # the first build's index, whole


# --- 2. two trainings into one folder ---------------------------------------------------------------------


def sft_args(setup: dict, output, steps: int) -> list[str]:
    lora = ["--lora-r", "2", "--lora-target-modules", "q_proj,v_proj"]
    return ["sft", *setup["data"], *TINY, *lora, "--max_steps", str(steps), "--output_dir", str(output)]


@pytest.mark.parametrize("command", ["ground", "sft"])
def test_two_trainings_into_one_folder_the_second_is_refused_and_the_first_finishes(
    cli_world, tmp_path, capsys, command
):
    out = tmp_path / "run"
    args = ground_args if command == "ground" else sft_args
    first = start(cli, *args(cli_world, out, 4))
    wait_for(lock_path(out).exists, child=first)
    assert cli(*args(cli_world, out, 4), "--seed", "1") == 2
    err = capsys.readouterr().err
    assert f"pid {first.pid}" in err and f"`{command}`" in err and "choose another output folder" in err
    assert first.wait(300) == 0, first.err[-3000:]
    assert json.loads((out / "run.json").read_text())["seed"] == 0
    for checkpoint in out.glob("checkpoint-*"):  # no checkpoint of the refused run mixed in
        assert json.loads((checkpoint / "run.json").read_text())["seed"] == 0
        assert checkpoint_problem(checkpoint) is None
    assert (out / "adapter" / "adapter_model.safetensors").is_file()


# --- 3. ground --output_dir DIR with the user's README --------------------------------------------------


def test_ground_into_a_folder_with_a_readme_keeps_it(cli_world, tmp_path, caplog):
    out = tmp_path / "project"
    out.mkdir()
    readme = "# My project\n\nWhat this folder is for.\n"
    (out / "README.md").write_text(readme)
    with caplog.at_level(logging.WARNING, logger="peft_grounded"):
        assert cli(*ground_args(cli_world, out, 4)) == 0
    assert (out / "README.md").read_text() == readme
    assert "is not a card TRL wrote: kept as it is" in caplog.text
    assert (out / "adapter" / "adapter_model.safetensors").is_file()


# --- 4. evaluate --output_dir <a run's folder>; diagnose likewise ---------------------------------------


def test_evaluate_into_a_runs_folder_is_refused_and_the_run_still_resumes(cli_world, strategy_run, capsys):
    out = strategy_run["out"]
    before = snapshot(out)
    adapter = str(out / "sft" / "adapter")
    code = cli("evaluate", *cli_world["data"], "--adapter", adapter, "--users", "2", "--output_dir", str(out))
    assert code == 2
    err = capsys.readouterr().err
    assert f"{out} is a training run's folder (it holds run.json)" in err and "metrics.json" in err
    assert snapshot(out) == before
    from peft_grounded.pipeline import run_strategy

    again = run_strategy("mean", strategy_run["experiment"], strategy_run["budget"], out, resume=True)
    assert again["metrics"] == strategy_run["record"]["metrics"]  # the demo's resume still accepts it


def test_diagnose_into_a_runs_folder_is_refused(cli_world, strategy_run, capsys):
    out = strategy_run["out"]
    before = snapshot(out)
    sids = str(cli_world["root"] / "sids")
    code = cli(
        "diagnose",
        str(out / "sft" / "adapter"),
        "--sid-index",
        sids,
        "--no-vocabulary",
        "--output_dir",
        str(out),
    )
    assert code == 2
    assert "is a training run's folder" in capsys.readouterr().err
    assert snapshot(out) == before


def test_evaluate_replaces_its_own_files_only_and_refuses_a_users_json_of_the_users(
    cli_world, strategy_run, tmp_path, capsys
):
    adapter = str(strategy_run["out"] / "sft" / "adapter")
    argv = ["evaluate", *cli_world["data"], "--adapter", adapter, "--users", "2", "--splits", "test"]
    argv += ["--num-beams", "10", "--ks", "1", "5"]
    out = tmp_path / "evaluation"
    assert cli(*argv, "--output_dir", str(out)) == 0
    (out / "notes.txt").write_text("mine")
    assert cli(*argv, "--output_dir", str(out)) == 0  # its own earlier output: replaced
    assert (out / "notes.txt").read_text() == "mine"
    assert {"metrics.json", "metrics.md", "likelihood.json", "users.json"} <= {p.name for p in out.iterdir()}

    data = tmp_path / "data"
    data.mkdir()
    (data / "users.json").write_text('{"alice": 1}')
    capsys.readouterr()
    assert cli(*argv, "--output_dir", str(data)) == 2
    assert "holds users.json, not written by `peft-grounded evaluate`" in capsys.readouterr().err
    assert (data / "users.json").read_text() == '{"alice": 1}' and sorted(os.listdir(data)) == ["users.json"]


def test_diagnose_refuses_a_metrics_json_another_tool_wrote(cli_world, strategy_run, tmp_path, capsys):
    out = tmp_path / "evaluation"
    out.mkdir()
    (out / "metrics.json").write_text('{"test": {"all": {"recall@10": 0.5}}}')  # evaluate's
    sids = str(cli_world["root"] / "sids")
    adapter = str(strategy_run["out"] / "sft" / "adapter")
    assert cli("diagnose", adapter, "--sid-index", sids, "--no-vocabulary", "--output_dir", str(out)) == 2
    assert "metrics.json was not written by `peft-grounded diagnose`" in capsys.readouterr().err
    assert (out / "metrics.json").read_text() == '{"test": {"all": {"recall@10": 0.5}}}'


# --- 5. --resume_from_checkpoint on a finished run ------------------------------------------------------


def test_resume_on_a_finished_run_is_a_no_op_that_says_so(cli_world, tmp_path, caplog):
    out = tmp_path / "run"
    assert cli(*ground_args(cli_world, out, 4)) == 0
    before = snapshot(out)
    for _ in range(2):  # every resume used to add a step
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="peft_grounded"):
            assert cli(*ground_args(cli_world, out, 4), "--resume_from_checkpoint") == 0
        assert "holds this run finished (step 4): nothing to resume" in caplog.text
    assert snapshot(out) == before
    assert not (out / "checkpoint-5").exists()


# --- 6. grow-adapter --overwrite ------------------------------------------------------------------------


def test_grow_adapter_overwrite_replaces_the_adapter_and_keeps_the_users_files(world, capsys):
    root = world["root"]
    assert grow(world, "grown", "--model_name_or_path", world["base"]) == 0
    grown = root / "grown"
    first_weights = (grown / "adapter_model.safetensors").read_bytes()
    (grown / "notes.txt").write_text("how I grew it")
    (grown / "eval").mkdir()
    (grown / "eval" / "metrics.json").write_text('{"test": {}}')
    (grown / "latest").symlink_to("eval")
    assert "library_name: peft" in (grown / "README.md").read_text()  # PEFT's card: the adapter's own
    capsys.readouterr()
    assert grow(world, "grown", "--model_name_or_path", world["base"], "--overwrite", "--init", "mean") == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[0])
    assert sorted(summary["kept"]) == ["eval", "latest", "notes.txt"]
    assert (grown / "adapter_model.safetensors").read_bytes() != first_weights  # replaced (mean init)
    assert (grown / "notes.txt").read_text() == "how I grew it"
    assert (grown / "eval" / "metrics.json").read_text() == '{"test": {}}'
    assert os.readlink(grown / "latest") == "eval"
    assert not list(root.glob(".grown*"))  # no temporary or old copy left


def test_grow_adapter_overwrite_keeps_a_readme_the_user_wrote(world, capsys):
    root = world["root"]
    assert grow(world, "grown", "--model_name_or_path", world["base"]) == 0
    (root / "grown" / "README.md").write_text("# Grown for the spring catalogue\n")
    assert grow(world, "grown", "--model_name_or_path", world["base"], "--overwrite") == 0
    assert (root / "grown" / "README.md").read_text() == "# Grown for the spring catalogue\n"
    assert (root / "grown" / "adapter_config.json").is_file()


# --- and a full disk through the command line --------------------------------------------------------------


def fill_at_checkpoint_4(argv: list[str]) -> int:
    """``peft-grounded ground`` whose disk fills right before its second checkpoint."""
    from peft_grounded.training import RunTrainer

    original = RunTrainer._save_checkpoint

    def fill_then_save(self, model, trial):
        if self.state.global_step == 4:
            limit_file_size(4000)
        return original(self, model, trial)

    RunTrainer._save_checkpoint = fill_then_save
    return main(argv)


def test_a_full_disk_during_ground_is_reported_and_resume_finishes_the_run(cli_world, tmp_path, capsys):
    out = tmp_path / "run"
    child = run(fill_at_checkpoint_4, ground_args(cli_world, out, 6))
    assert child.returncode == 2, child.err[-3000:]
    assert "error: no space to write checkpoint" in child.err and "checkpoint-2, is kept" in child.err
    assert "Traceback" not in child.err
    assert cli(*ground_args(cli_world, out, 6), "--resume_from_checkpoint") == 0
    state = json.loads((out / "checkpoint-6" / "trainer_state.json").read_text())
    assert state["global_step"] == 6 and not (out / "checkpoint-7").exists()
    assert (out / "adapter" / "adapter_model.safetensors").is_file()


# --- the demo into a folder of the user's ----------------------------------------------------------------


def test_the_demo_refuses_a_folder_holding_a_report_of_the_users(cli_world, tmp_path):
    from helpers.toy_catalogue import toy_catalogue

    from peft_grounded.pipeline import run_demo

    out = tmp_path / "mine"
    out.mkdir()
    (out / "report.md").write_text("# My report\n")
    with pytest.raises(ValueError, match=r"holds report.md but no demo run \(run.json\)"):
        run_demo("smoke", out, model=cli_world["base"], catalogue=toy_catalogue(), diagnostics=False)
    assert sorted(os.listdir(out)) == ["report.md"] and (out / "report.md").read_text() == "# My report\n"
