"""DeepSpeed ZeRO-3 on two CPU processes (DeepSpeed's CPU accelerator, gloo), launched with the shipped
examples/accelerate/deepspeed_zero3.yaml: the FSDP checks of tests/test_sharded_fsdp.py for grounding on a
tied head and SFT with a stacked LoRA on an untied one (PEFT #2603 / #2946 broke exactly there: trainable new
rows under ZeRO-3, and saving them). DeepSpeed is the ``deepspeed`` extra (scripts/setup.sh installs it).
"""

from __future__ import annotations

import pytest
from sharded_checks import (
    assert_killed,
    assert_matches_single,
    assert_resumed_like_uninterrupted,
    assert_saved_adapter_is_the_gathered_rows_and_lora,
    assert_sharded_memory,
    checkpoint_bytes,
    launch,
    ranks,
    reference,
)
from sharded_run import job_dir

pytest.importorskip("deepspeed", reason="the deepspeed extra: pip install -e '.[deepspeed]'")

JOBS = ["grounding:qwen3:tied", "sft:qwen3:untied"]
KILLED = "sft:qwen3:untied:killed"


@pytest.mark.slow
@pytest.mark.multiproc
def test_zero3_matches_one_process_saves_gathered_and_resumes(tmp_path, tmp_path_factory):
    first = launch("deepspeed_zero3.yaml", tmp_path, [*JOBS, KILLED], "--kill-at", "2")
    assert_killed(first, job_dir(tmp_path, KILLED))
    resumed = launch("deepspeed_zero3.yaml", tmp_path, [KILLED], "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for job in JOBS:
        run_dir, single = job_dir(tmp_path, job), reference(job, tmp_path_factory)
        assert all(r["deepspeed"] and r["world_size"] == 2 for r in ranks(run_dir)), job
        assert_matches_single(run_dir, single)
        assert_saved_adapter_is_the_gathered_rows_and_lora(run_dir, single, job)
        assert_sharded_memory(run_dir, single)
        frozen = sum(r["frozen_bytes"] for r in ranks(run_dir))
        assert checkpoint_bytes(run_dir / "checkpoint-2" / "global_step2") < frozen / 20
    assert_resumed_like_uninterrupted(job_dir(tmp_path, KILLED), job_dir(tmp_path, JOBS[-1]))
