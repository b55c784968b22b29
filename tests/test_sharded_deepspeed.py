"""DeepSpeed ZeRO-3 on two CPU processes (DeepSpeed's CPU accelerator, gloo), launched with the shipped
examples/accelerate/deepspeed_zero3.yaml: the FSDP checks of tests/test_sharded_fsdp.py for grounding on a
tied head and SFT with a stacked LoRA on an untied one (PEFT #2603 / #2946 broke exactly there: trainable new
rows under ZeRO-3, and saving them). DeepSpeed is the ``deepspeed`` extra (scripts/setup.sh installs it).
"""

from __future__ import annotations

import pytest
from helpers.sharded_checks import check_sharded_training

pytest.importorskip("deepspeed", reason="the deepspeed extra: pip install -e '.[deepspeed]'")

# the last one runs twice: straight, and killed after its checkpoint at step 2, then resumed
JOBS = ["grounding:qwen3:tied", "sft:qwen3:untied"]


@pytest.mark.slow
@pytest.mark.multiproc
def test_zero3_matches_one_process_saves_gathered_and_resumes(tmp_path, tmp_path_factory):
    weights = ["global_step2"]  # DeepSpeed's model and optimiser partitions
    check_sharded_training(
        "deepspeed_zero3.yaml", tmp_path, tmp_path_factory, JOBS, kind="deepspeed", weights=weights
    )
