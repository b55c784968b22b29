"""Two nodes simulated on loopback: ``accelerate launch --num_machines 2`` with the shipped
examples/accelerate/ddp_multinode.yaml, one process per "node" (DDP, gloo), the checks of the single-node DDP
test: both ranks end equal, and equal to one process with the same global batch."""

from __future__ import annotations

import json

import pytest
from helpers.sharded_checks import assert_matches_single, launch_two_nodes, ranks, reference
from helpers.sharded_run import job_dir

JOBS = ["grounding:llama:untied", "sft:llama:tied"]  # also in test_sharded_fsdp.py: one reference each


@pytest.mark.slow
@pytest.mark.multiproc
def test_two_nodes_match_one_process(tmp_path, tmp_path_factory):
    for node in launch_two_nodes("ddp_multinode.yaml", tmp_path, JOBS):
        assert node.returncode == 0, node.stderr[-3000:]
    for job in JOBS:
        run_dir, single = job_dir(tmp_path, job), reference(job, tmp_path_factory)
        placed = ranks(run_dir)
        assert [(r["rank"], r["group_rank"], r["local_rank"]) for r in placed] == [(0, 0, 0), (1, 1, 0)]
        assert all(r["world_size"] == 2 and not r["fsdp"] for r in placed)
        assert_matches_single(run_dir, single)
        assert (run_dir / "adapter" / "adapter_model.safetensors").is_file()
        alone = json.loads((single / "rank0.json").read_text())
        assert [r["trainable_bytes"] for r in placed] == [alone["trainable_bytes"]] * 2  # DDP replicates them
