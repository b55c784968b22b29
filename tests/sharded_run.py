"""A small grounding or SFT run as a script, for the sharded (FSDP, DeepSpeed) and multi-node tests.

python tests/sharded_run.py OUT [--stage grounding|sft] [--arch llama|qwen3] [--untied] [--max-steps 4]
    [--batch 4] [--kill-at 2] [--resume] [--smollm2]

Run alone (one process), under ``accelerate launch`` or ``torchrun``. Writes into OUT, besides the trainer's
checkpoints and ``adapter/``: ``trained_rank{R}.pt`` (the adapter's trainable tensors, gathered to full
shapes, on every rank), ``probe_logits.pt`` (the trained model's logits on a fixed input, rank 0) and
``memory_rank{R}.json`` (bytes of the trainable tensors and their optimiser state held by that rank).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

PROBE = "The Comedy Story 0 is <a_1><b_2>, and <a_0><b_3>"


def enable_fsdp_on_cpu() -> None:
    """Let accelerate run FSDP on CPU processes (gloo), as it does on GPUs.

    accelerate 1.15 turns a launch with ``distributed_type: FSDP`` into FSDP only on accelerator devices: on
    CPU (``use_cpu``) it keeps the plain multi-CPU (DDP) state and drops the FSDP plugin without a word.
    This makes the same state change accelerate makes on a GPU (``AcceleratorState.__init__``'s FSDP branch);
    everything after it (``fully_shard``, the sharded checkpoints, the gathered saves) is accelerate's and
    torch's own code, running over gloo.
    """
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    original = AcceleratorState.__init__
    if getattr(original, "_cpu_fsdp", False):
        return

    def __init__(self, mixed_precision=None, cpu=False, dynamo_plugin=None, deepspeed_plugin=None, fsdp_plugin=None, **kwargs):  # fmt: skip
        original(self, mixed_precision, cpu, dynamo_plugin, deepspeed_plugin, fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            if self._mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self._mixed_precision)
            self.fsdp_plugin = fsdp_plugin
            PartialState._shared_state["distributed_type"] = self.distributed_type

    __init__._cpu_fsdp = True
    AcceleratorState.__init__ = __init__


def full(tensor):
    """A parameter's full value on every rank (FSDP2 holds a DTensor shard)."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def local_bytes(tensor) -> int:
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("output_dir")
    parser.add_argument("--stage", choices=("grounding", "sft"), default="grounding")
    parser.add_argument("--arch", choices=("llama", "qwen3"), default="llama")
    parser.add_argument("--untied", action="store_true")
    parser.add_argument("--smollm2", action="store_true", help="the real SmolLM2-135M instead of a tiny model")
    parser.add_argument("--max-steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--kill-at", type=int, default=None, help="SIGKILL rank 0 after this checkpoint")
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()

    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        enable_fsdp_on_cpu()

    import torch
    from toy_catalogue import toy_catalogue, toy_index
    from transformers import AutoTokenizer, TrainerCallback

    import peft_grounded
    from peft_grounded import assets
    from peft_grounded.grounding import GroundingConfig, GroundingTrainer, grounding_dataset
    from peft_grounded.recommend import RecommendationConfig, RecommendationTrainer
    from peft_grounded.recommend.data import training_dataset

    rank = int(os.environ.get("RANK", "0"))
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(assets.smollm2())
    catalogue = toy_catalogue()
    index = toy_index(catalogue)
    if args.smollm2:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(assets.smollm2(), dtype=torch.float32)
        if args.untied:
            model.config.tie_word_embeddings = False
            model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    else:
        from conftest import build_tiny_model

        model = build_tiny_model(args.arch, not args.untied)
    new = peft_grounded.add_tokens(tokenizer, model, index.token_strings)
    peft_config = peft_grounded.GroundedTokenConfig(token_indices=new, init="mean", task_type="CAUSAL_LM")

    class Kill(TrainerCallback):
        """A crash: rank 0 dies at the start of the step after checkpoint ``kill_at`` was written."""

        def on_step_begin(self, a, state, control, **kwargs):
            if args.kill_at is not None and state.global_step == args.kill_at and rank == 0:
                os.kill(os.getpid(), signal.SIGKILL)

    common = dict(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch,
        learning_rate=args.lr,
        save_steps=2,
        logging_steps=1,
        use_cpu=True,
        bf16=False,
        max_length=128,
        disable_tqdm=True,
        seed=0,
        dataloader_num_workers=0,
    )
    if args.stage == "grounding":
        trainer = GroundingTrainer(
            model,
            GroundingConfig(**common),
            peft_config=peft_config,
            train_dataset=grounding_dataset(catalogue, index, tokenizer),
            processing_class=tokenizer,
            callbacks=[Kill()],
        )
    else:
        from peft import get_peft_model

        model = get_peft_model(model, peft_config)
        peft_grounded.add_lora(model, r=2, lora_alpha=4, target_modules="all-linear")
        trainer = RecommendationTrainer(
            model,
            RecommendationConfig(**common),
            train_dataset=training_dataset(catalogue.leave_one_out(), index, catalogue, tokenizer),
            processing_class=tokenizer,
            callbacks=[Kill()],
        )
    trainer.train(resume_from_checkpoint=True if args.resume else None)

    out = Path(args.output_dir)
    trained = {n: full(p).detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    torch.save(trained, out / f"trained_rank{rank}.pt")
    state = trainer.optimizer.state
    memory = {
        "world_size": trainer.args.world_size,
        "fsdp": bool(trainer.is_fsdp_enabled),
        "trainable_bytes": sum(local_bytes(p) for p in trainer.model.parameters() if p.requires_grad),
        "optimizer_bytes": sum(
            local_bytes(v) for s in state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.ndim
        ),
        "frozen_bytes": sum(local_bytes(p) for p in trainer.model.parameters() if not p.requires_grad),
    }
    (out / f"memory_rank{rank}.json").write_text(json.dumps(memory))
    probe = tokenizer(PROBE, return_tensors="pt")
    trainer.model.eval()
    with torch.no_grad():
        logits = trainer.model(**probe).logits
    if rank == 0:
        torch.save(logits, out / "probe_logits.pt")


if __name__ == "__main__":
    main()
