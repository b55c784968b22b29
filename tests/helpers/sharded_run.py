"""Small grounding and SFT runs as a script, for the sharded (FSDP2, DeepSpeed ZeRO) and multi-node tests and
benchmarks/bench_sharding.py.

python tests/helpers/sharded_run.py OUT JOB [JOB ...] [--max-steps 4] [--batch 4] [--kill-at 2] [--resume]

JOB is ``stage:model:head``: stage ``grounding`` or ``sft`` (a LoRA stacked on the rows), model ``llama`` or
``qwen3`` (tiny, from tests/conftest.py) or ``smollm2`` (the real weights), head ``tied`` or ``untied``; an
optional fourth field only renames the output folder. Run alone (one process), under ``accelerate launch``
or ``torchrun``; the jobs run one after the other in the same processes. Each writes into ``OUT/<job>/``,
besides the trainer's checkpoints and ``adapter/``:

* ``initial.pt`` (rank 0): the trainable tensors (rows, LoRA) before training;
* ``trained_rank{R}.pt``: the same tensors at full size, as rank R sees them after training;
* ``probe_logits.pt`` (rank 0): the trained model's logits on :data:`PROBE`;
* ``rank{R}.json``: bytes rank R holds of the trainable tensors, their optimiser state and the frozen weights,
  the process's peak RSS, and where the launcher placed it (rank, local rank, node).

``--kill-at STEP``: rank 0 of the last job SIGKILLs itself at the start of the step after checkpoint STEP.
``--resume``: every job resumes from its last checkpoint (or starts, if it has none).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import sys
from pathlib import Path

if not __package__:  # run by path: tests/ on sys.path, as under pytest (``helpers``, ``conftest``)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROBE = "The Comedy Story 0 is <a_1><b_2>, and <a_0><b_3> is"


def enable_fsdp_on_cpu() -> None:
    """Let accelerate run FSDP on CPU processes (gloo), as it does on GPUs.

    accelerate 1.15 keeps ``distributed_type: FSDP`` only on accelerator devices: on CPU (``use_cpu``) it
    keeps the plain multi-CPU (DDP) state and drops the FSDP plugin without a word. This makes the state change
    that ``AcceleratorState.__init__`` makes on a GPU; everything after it (``fully_shard``, the sharded
    checkpoints, the gathered saves) is accelerate's and torch's own code, over gloo.
    """
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    original = AcceleratorState.__init__
    if getattr(original, "cpu_fsdp", False):
        return

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        fsdp_plugin = kwargs.get("fsdp_plugin", args[4] if len(args) > 4 else None)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            if self._mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self._mixed_precision)
            self.fsdp_plugin = fsdp_plugin
            PartialState._shared_state["distributed_type"] = self.distributed_type

    __init__.cpu_fsdp = True
    AcceleratorState.__init__ = __init__


def skip_deepspeed_shm_kernel() -> None:
    """DeepSpeed's CPU accelerator compiles a shared-memory all-reduce kernel on first use (minutes on two
    cores); without it DeepSpeed's collectives go through torch.distributed (gloo), which is what is tested."""
    import deepspeed.comm.torch

    deepspeed.comm.torch.build_shm_op = lambda: None


def using(kind: str) -> bool:
    return os.environ.get(f"ACCELERATE_USE_{kind}", "false").lower() == "true"


def job_dir(out: Path, job: str) -> Path:
    return Path(out) / job.replace(":", "-")


def parse_job(job: str) -> tuple[str, str, bool]:
    stage, model, head, *_ = job.split(":")
    if stage not in ("grounding", "sft") or model not in ("llama", "qwen3", "smollm2"):
        raise SystemExit(
            f"bad job {job!r}: stage:model:head with grounding|sft, llama|qwen3|smollm2, tied|untied"
        )
    if head not in ("tied", "untied"):
        raise SystemExit(f"bad job {job!r}: head is tied or untied")
    return stage, model, head == "tied"


def base_model(model_name: str, tied: bool):
    """The base: a tiny model from tests/conftest.py, or SmolLM2-135M (tied; untied gets a copy of the head)."""
    import torch

    from peft_grounded import assets

    if model_name != "smollm2":
        from conftest import build_tiny_model

        return build_tiny_model(model_name, tied)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(assets.smollm2(), dtype=torch.float32)
    if not tied:
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
        model.config.tie_word_embeddings = False
    return model


def toy_data(items: int = 16, levels: int = 2, codes: int = 4):
    from helpers.toy_catalogue import toy_catalogue, toy_index

    catalogue = toy_catalogue(n_items=items)
    return catalogue, toy_index(catalogue, levels=levels, codes=codes)


def load_trained(job: str, adapter_dir: Path):
    """A fresh base with the adapter at ``adapter_dir`` loaded in this (single) process, and its tokenizer."""
    from transformers import AutoTokenizer

    from peft_grounded import assets
    from peft_grounded.hub import load_grounded

    _, model_name, tied = parse_job(job)
    tokenizer = AutoTokenizer.from_pretrained(assets.smollm2())
    return load_grounded(base_model(model_name, tied), tokenizer, adapter_dir), tokenizer


def probe_logits(model, tokenizer):
    import torch

    model.eval()
    with torch.no_grad():
        return model(**tokenizer(PROBE, return_tensors="pt")).logits


def _full(param):
    """A trainable parameter's full value on this rank (collective for FSDP2 and ZeRO-3 shards)."""
    if hasattr(param, "full_tensor"):
        return param.full_tensor()
    if hasattr(param, "ds_tensor"):
        import deepspeed

        with deepspeed.zero.GatheredParameters([param]):
            return param.detach().clone()
    return param


def _local(tensor):
    """The part of ``tensor`` this rank stores (FSDP2's local shard, ZeRO-3's partition, or all of it)."""
    if hasattr(tensor, "ds_tensor"):
        return tensor.ds_tensor
    if hasattr(tensor, "to_local"):
        return tensor.to_local()
    return tensor


def _local_bytes(tensor) -> int:
    local = _local(tensor)
    return local.numel() * local.element_size()


def memory(trainer) -> dict:
    """Bytes this rank holds: trainable tensors, their optimiser state (moments, and master copies where the
    optimiser keeps its own), frozen weights; and the process's peak RSS."""
    import torch

    params = list(trainer.model.parameters())
    own = {_local(p).data_ptr() for p in params}
    inner = trainer.optimizer
    while hasattr(inner, "optimizer"):  # accelerate's wrapper, DeepSpeed's ZeRO optimizer, the torch one
        inner = inner.optimizer
    held = [p for group in inner.param_groups for p in group["params"]]
    return {
        "trainable_bytes": sum(_local_bytes(p) for p in params if p.requires_grad),
        "optimizer_state_bytes": sum(
            _local_bytes(v)
            for s in inner.state.values()
            for v in s.values()
            if isinstance(v, torch.Tensor) and v.ndim
        ),
        "master_bytes": sum(_local_bytes(p) for p in held if _local(p).data_ptr() not in own),
        "frozen_bytes": sum(_local_bytes(p) for p in params if not p.requires_grad),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "fsdp": bool(trainer.is_fsdp_enabled),
        "deepspeed": bool(trainer.is_deepspeed_enabled),
        # where the launcher put this process: RANK, LOCAL_RANK, GROUP_RANK (the node), WORLD_SIZE
        **{k.lower(): int(os.environ.get(k, "0")) for k in ("RANK", "LOCAL_RANK", "GROUP_RANK")},
        "world_size": trainer.args.world_size,
    }


def run_job(
    out: Path,
    job: str,
    *,
    max_steps: int = 4,
    batch: int = 4,
    lr: float = 0.05,
    kill_at: int | None = None,
    resume: bool = False,
    index_size: tuple[int, int, int] = (16, 2, 4),
) -> Path:
    """Train ``job`` (see the module docstring) into ``job_dir(out, job)``; returns that folder."""
    import torch
    from peft import get_peft_model
    from transformers import AutoTokenizer, TrainerCallback

    import peft_grounded
    from peft_grounded import assets
    from peft_grounded.training.grounding import GroundingTrainer, grounding_dataset
    from peft_grounded.training.sft import RecommendationConfig, RecommendationTrainer
    from peft_grounded.training.sft.data import training_dataset
    from peft_grounded.training.stage_config import GroundingConfig

    stage, model_name, tied = parse_job(job)
    directory = job_dir(out, job)
    rank = int(os.environ.get("RANK", "0"))
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(assets.smollm2())
    catalogue, index = toy_data(*index_size)
    model = base_model(model_name, tied)
    new = peft_grounded.add_tokens(tokenizer, model, index.token_strings)
    peft_config = peft_grounded.GroundedTokenConfig(token_indices=new, init="mean", task_type="CAUSAL_LM")

    class Kill(TrainerCallback):
        """A crash: rank 0 dies at the start of the step after checkpoint ``kill_at`` was written."""

        def on_step_begin(self, a, state, control, **kwargs):
            if kill_at is not None and state.global_step == kill_at and rank == 0:
                os.kill(os.getpid(), signal.SIGKILL)

    common = dict(
        output_dir=str(directory),
        max_steps=max_steps,
        per_device_train_batch_size=batch,
        learning_rate=lr,
        save_steps=2,
        logging_steps=1,
        # accelerate takes DeepSpeed on CPU processes only without use_cpu (then the backend must be named)
        use_cpu=not using("DEEPSPEED"),
        ddp_backend="gloo" if using("DEEPSPEED") else None,
        bf16=False,
        max_length=128,
        disable_tqdm=True,
        seed=0,
        dataloader_num_workers=0,
    )
    if stage == "grounding":
        trainer = GroundingTrainer(
            model,
            GroundingConfig(**common),
            peft_config=peft_config,
            train_dataset=grounding_dataset(catalogue, index, tokenizer),
            processing_class=tokenizer,
            callbacks=[Kill()],
        )
    else:
        model = get_peft_model(model, peft_config)
        peft_grounded.add_lora(model, r=2, lora_alpha=4, target_modules="all-linear")
        trainer = RecommendationTrainer(
            model,
            # the full head, set: sharded training cannot take the SID-only softmax (the default turns it
            # off there), and the one-process reference would otherwise take it
            RecommendationConfig(**common, sid_softmax=False),
            train_dataset=training_dataset(catalogue.leave_one_out(), index, catalogue, tokenizer),
            processing_class=tokenizer,
            callbacks=[Kill()],
        )
    if rank == 0 and not resume:
        initial = {
            n: p.detach().cpu().clone() for n, p in trainer.model.named_parameters() if p.requires_grad
        }
        directory.mkdir(parents=True, exist_ok=True)
        torch.save(initial, directory / "initial.pt")
    trainer.train(resume_from_checkpoint=True if resume else None)

    trained = {
        n: _full(p).detach().cpu().clone() for n, p in trainer.model.named_parameters() if p.requires_grad
    }
    torch.save(trained, directory / f"trained_rank{rank}.pt")
    (directory / f"rank{rank}.json").write_text(json.dumps(memory(trainer)))
    logits = probe_logits(trainer.model, tokenizer)  # every rank: the forward is collective under sharding
    if rank == 0:
        torch.save(logits, directory / "probe_logits.pt")
    return directory


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("output_dir")
    parser.add_argument("jobs", nargs="+")
    parser.add_argument("--max-steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--kill-at", type=int, default=None, help="kill the last job after this checkpoint")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument(
        "--index", type=int, nargs=3, default=(16, 2, 4), metavar=("ITEMS", "LEVELS", "CODES")
    )
    args = parser.parse_args()
    for job in args.jobs:
        parse_job(job)
    if using("FSDP"):
        enable_fsdp_on_cpu()
    if using("DEEPSPEED"):
        skip_deepspeed_shm_kernel()

    from accelerate.state import AcceleratorState
    from transformers.integrations import unset_hf_deepspeed_config

    for i, job in enumerate(args.jobs):
        # each job as in a process of its own: a fresh plugin (accelerate adapts it to the model), and no
        # ZeRO-3 config left for transformers (which would build the next base under deepspeed.zero.Init)
        AcceleratorState._reset_state()
        unset_hf_deepspeed_config()
        run_job(
            Path(args.output_dir),
            job,
            max_steps=args.max_steps,
            batch=args.batch,
            lr=args.lr,
            kill_at=args.kill_at if i == len(args.jobs) - 1 else None,
            resume=args.resume,
            index_size=tuple(args.index),
        )


if __name__ == "__main__":
    main()
