"""FSDP2 (``fully_shard``) on two CPU processes (gloo), launched with the shipped examples/accelerate/fsdp.yaml:
grounding and SFT with a stacked LoRA, tied and untied heads, Llama and Qwen3 (tiny) and once SmolLM2.

For each run: the trained rows and LoRA equal one process with the same global batch; the saved adapter holds
only them, gathered, and loads in one process with the sharded model's logits; each rank holds half of them,
of their optimiser state and of the frozen weights; and a run killed after its first checkpoint resumes to
where the uninterrupted run ends. The tolerances are in tests/helpers/sharded_checks.py.

accelerate 1.15 keeps FSDP on accelerator devices only; tests/helpers/sharded_run.py makes on CPU the state change it
makes on a GPU (``enable_fsdp_on_cpu``), the rest is accelerate's and torch's own code.
"""

from __future__ import annotations

import pytest
from helpers.sharded_checks import (
    assert_matches_single,
    assert_saved_adapter_is_the_gathered_rows_and_lora,
    assert_sharded_memory,
    check_sharded_training,
    launch,
    reference,
)
from helpers.sharded_run import job_dir

# the last one runs twice: straight, and killed after its checkpoint at step 2, then resumed
JOBS = ["grounding:llama:untied", "grounding:qwen3:tied", "sft:llama:tied", "sft:qwen3:untied"]


@pytest.mark.slow
@pytest.mark.multiproc
def test_fsdp_matches_one_process_saves_gathered_and_resumes(tmp_path, tmp_path_factory):
    weights = ["pytorch_model_fsdp_0", "optimizer_0"]  # accelerate's distributed-checkpoint shards
    check_sharded_training("fsdp.yaml", tmp_path, tmp_path_factory, JOBS, kind="fsdp", weights=weights)


@pytest.mark.slow
@pytest.mark.multiproc
def test_fsdp_on_smollm2(tmp_path, tmp_path_factory):
    job = "sft:smollm2:tied"
    result = launch("fsdp.yaml", tmp_path, [job], "--max-steps", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir, single = job_dir(tmp_path, job), reference(job, tmp_path_factory, max_steps=2)
    assert_matches_single(run_dir, single, per_tensor_update=1e-2)
    assert_saved_adapter_is_the_gathered_rows_and_lora(run_dir, single, job, logits_atol=2e-4)
    assert_sharded_memory(run_dir, single)
