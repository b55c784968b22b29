"""``torch.compile`` of the recipe's decoder blocks against eager, on the same padding-free batches.

    OMP_NUM_THREADS=1 python benchmarks/bench_compile_blocks.py --precision bf16 --parts mlp

The ``cpu`` recipe's model of ``bench_step_limit.py`` (8 SmolLM2 blocks, rank-8 LoRA, SID-only softmax) on 12
seeded padding-free batches of ``--dataset``, attention per sequence as the trainer runs it on a CPU (float32
under bf16). ``--parts mlp`` compiles what the trainer's ``compile_blocks`` compiles (each block's MLP and norms,
``training.steps.compiled_blocks``); ``--parts blocks`` whole blocks (``nn.Module.compile(dynamic=True)``). The
compiled and eager steps alternate, so a busy machine slows both alike. Prints the compile time, the median
steps, their median ratio and the largest loss gap. ``--precision`` is the demo's (``DemoArguments``): fp32 here
by default; auto: the machine's choice (bf16 where it runs natively).
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from peft_grounded import assets
from peft_grounded.adapter import add_lora
from peft_grounded.cli.demo import DemoArguments
from peft_grounded.prompts import PromptFormat
from peft_grounded.sid_head import compact_head
from peft_grounded.sids import load_catalogue
from peft_grounded.sids.extended_base import RowStart, sid_model
from peft_grounded.training.sft import training_dataset
from peft_grounded.training.sft.recommendation_trainer import shallow_base
from peft_grounded.training.steps import compiled_blocks, compiled_parts, training_attention

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling, also under runpy
from bench_step_limit import BATCH, HISTORY, collate, index_for

try:
    from benchmarks._args import package_fields, parse
except ModuleNotFoundError:  # run as a file: its folder is on sys.path, not the repository
    from _args import package_fields, parse


@dataclass
class Settings:
    parts: Literal["mlp", "blocks"] = field(
        default="mlp",
        metadata={"help": "mlp: each block's MLP and norms (the trainer's); blocks: whole blocks"},
    )
    dataset: str = field(default="movielens-100k", metadata={"help": "a catalogue name or folder"})
    output: Path = field(
        default=Path("runs/compile-blocks"), metadata={"help": "the cut base and the SID index go here"}
    )


# the blocks' precision, as the package declares it (the demo's --precision); float32 here by default
PrecisionFields = package_fields(DemoArguments, "precision")
DEFAULTS = {"precision": "fp32"}


def blocks_bf16(precision: str) -> bool:
    """``--precision`` read: bf16 or fp32 forced, auto the machine's choice."""
    from peft_grounded.precision import script_precision

    return precision == "bf16" or (precision == "auto" and script_precision().bf16)


def parse_args(argv=None) -> Settings:
    """The settings, the package's precision set on them (``args.precision``: fp32 or bf16, auto resolved)."""
    args, chosen = parse(
        (Settings, PrecisionFields),
        argv,
        prog="bench_compile_blocks.py",
        description=__doc__,
        check=lambda args, chosen: (
            f"{args}\n{chosen} (blocks in {'bf16' if blocks_bf16(chosen.precision) else 'fp32'})"
        ),
        defaults=DEFAULTS,
    )
    args.precision = "bf16" if blocks_bf16(chosen.precision) else "fp32"
    return args


def main(argv=None) -> None:
    from trl.trainer.utils import add_fused_lm_head

    args = parse_args(argv)
    bf16 = args.precision == "bf16"
    catalogue = load_catalogue(args.dataset)
    index = index_for(catalogue, args.output / f"sids-{Path(args.dataset).name}")
    base = str(shallow_base(assets.smollm2(), 8, args.output / "base-8"))
    dtype = torch.bfloat16 if bf16 else torch.float32
    tokenizer, model = sid_model(base, index, start=RowStart(init="centroid", init_scale=0.1), dtype=dtype)
    add_lora(model, r=8, lora_alpha=16, target_modules="all-linear")
    for param in model.parameters():
        if param.requires_grad:
            param.data = param.data.float()
    add_fused_lm_head(model.get_base_model(), outputs=("log_probs", "entropy", "is_top1"))
    model.train()
    fmt = PromptFormat(objective="sequence", max_history=HISTORY)
    data = training_dataset(catalogue.leave_one_out(), index, catalogue, tokenizer, fmt)
    rng, steps = random.Random(0), 12
    rows = [[data[i] for i in rng.sample(range(len(data)), BATCH)] for _ in range(steps + 1)]
    batches = [collate(r, tokenizer.pad_token_id or 0, True) for r in rows]
    optimizer = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=0.0)

    def step(batch) -> tuple[float, float]:
        start = time.perf_counter()
        optimizer.zero_grad()
        autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext()
        with training_attention(model, float32=bf16, per_sequence=True):
            with autocast, compact_head(model, sid_ids=model.base_model.grounded_token_ids()):
                out = model(**batch, fused_lm_head=True, use_cache=False)
            out.loss.backward()
        optimizer.step()
        return time.perf_counter() - start, out.loss.item()

    if args.parts == "mlp":
        parts = compiled_parts(model)
        with compiled_blocks(model, True):
            compiled = [part.forward for part in parts]
        eager = [part.forward for part in parts]

        def use(on: bool) -> None:
            for part, fn in zip(parts, compiled if on else eager, strict=True):
                part.forward = fn
    else:
        blocks = model.get_base_model().model.layers
        for block in blocks:
            block.compile(dynamic=True)
        compiled_calls = [block._compiled_call_impl for block in blocks]

        def use(on: bool) -> None:
            for block, fn in zip(blocks, compiled_calls, strict=True):
                block._compiled_call_impl = fn if on else None

    start = time.perf_counter()
    use(True)
    step(batches[0])
    compile_s = time.perf_counter() - start
    use(False)
    step(batches[0])
    times, losses = {True: [], False: []}, {True: [], False: []}
    for i in range(1, steps + 1):
        for on in (True, False) if i % 2 else (False, True):
            use(on)
            seconds, loss = step(batches[i])
            times[on].append(seconds)
            losses[on].append(loss)
    ratio = statistics.median(e / c for e, c in zip(times[False], times[True], strict=True))
    gap = max(abs(a - b) for a, b in zip(losses[True], losses[False], strict=True))
    print(
        f"| {Path(args.dataset).name} | {args.precision} | {args.parts} | compile + first step {compile_s:.1f} s | eager {statistics.median(times[False]):.3f} s "
        f"| compiled {statistics.median(times[True]):.3f} s | {ratio:.2f}x | loss gap {gap:.1e} |"
    )


if __name__ == "__main__":
    main()
