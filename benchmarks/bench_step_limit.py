"""The SFT step against the machine's limit: the recipe's step timed beside the matrix products it must do.

    OMP_NUM_THREADS=1 python benchmarks/bench_step_limit.py --datasets movielens-100k ../shared/data/amazon-office

For each catalogue, the ``cpu`` recipe's model (SmolLM2-135M cut to its first 8 decoder blocks, a centroid
start, a rank-8 LoRA on every linear layer, the sequence objective over 19 items of history, windows of at most
128 tokens, batches of 8, the SID-only softmax) and, in each precision this CPU runs natively (float32
always; bf16 where :func:`peft_grounded.precision.choose_precision` finds it native: the frozen base in bf16
under bf16 autocast, the rows and the LoRA in float32, attention in float32, as the trainer runs there), it times
``--steps`` training steps (forward with the trainer's loss, backward, AdamW) on seeded batches, and in the
same run the matrix products such a step cannot avoid: for every linear layer of the 8 blocks, the forward
product and the input-gradient product (the frozen weights need no weight gradient) over the batch's real
(non-padding) tokens, and over its padded tokens. The table gives the median step, the real and padded tokens
per step, the products' time for each, and the ratio of the step to them, for the trainer's padded batches
and for the same rows padding-free (concatenated into one row, position ids restarting at each row, as TRL's
``padding_free`` collates them), under the row-wide mask, with each LoRA layer as one stacked product as
``fused_lora`` trains it, and with each block's MLP and norms compiled as ``compile_blocks`` trains them (where
``compile_problem()`` finds no obstacle), and in bf16 with the residual stream and the SID head in float32 as
``float32_stream`` trains them. The variants alternate step by step; the largest gap between each
variant's loss and the padded one on the same rows is printed. 1.0x is the machine's limit for this model (attention's own products,
the LoRA and the SID head are small beside them and left out, so the limit is a floor). SIDs come from seeded
Gaussian item vectors (RQ-KMeans 3 x 64 + a disambiguation level): the speed does not depend on what the
vectors mean.
"""

from __future__ import annotations

import os
import platform
import random
import statistics
import time
from contextlib import nullcontext, suppress
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from peft_grounded import assets
from peft_grounded.adapter import add_lora
from peft_grounded.precision import choose_precision
from peft_grounded.prompts import PromptFormat
from peft_grounded.sid_head import compact_head
from peft_grounded.sids import SIDIndex, build_sids, load_catalogue
from peft_grounded.sids.extended_base import RowStart, sid_model
from peft_grounded.sids.index import JSON_NAME
from peft_grounded.training.fused_lora import fused_lora
from peft_grounded.training.sft import training_dataset
from peft_grounded.training.sft.recommendation_trainer import shallow_base
from peft_grounded.training.steps import (
    compile_problem,
    compiled_blocks,
    float32_stream,
    training_attention,
)

try:
    from benchmarks._args import parse
except ModuleNotFoundError:  # run as a file: its folder is on sys.path, not the repository
    from _args import parse

BLOCKS, BATCH, MAX_LENGTH, HISTORY = 8, 8, 128, 19


@dataclass(frozen=True)
class Variant:
    """One way to run the same step."""

    label: str
    padding_free: bool = True
    per_sequence: bool = True  # attention per packed sequence (the trainer's), else under the row-wide mask
    fused: bool = False  # fused_lora
    compiled: bool = False  # compile_blocks
    stream: bool = False  # float32_stream (bf16 only: a float32 step's stream is float32 already)


VARIANTS = (
    Variant("padded", padding_free=False),
    Variant("padding-free, attention per sequence"),
    Variant("padding-free, row-wide mask", per_sequence=False),
    Variant("padding-free, LoRA fused", fused=True),
    Variant("padding-free, MLP and norms compiled", compiled=True),
    Variant("padding-free, LoRA fused, MLP and norms compiled", fused=True, compiled=True),
    Variant(
        "padding-free, LoRA fused, MLP and norms compiled, float32 stream",
        fused=True,
        compiled=True,
        stream=True,
    ),
)


@dataclass
class Settings:
    datasets: list[str] = field(
        default_factory=lambda: ["movielens-100k"], metadata={"help": "catalogue names or folders"}
    )
    steps: int = field(default=6, metadata={"help": "timed steps per precision (after one warm-up)"})
    repeats: int = field(default=5, metadata={"help": "timings of the products alone (best kept)"})
    output: Path = field(
        default=Path("runs/bench_step_limit"), metadata={"help": "the cut base and the SID indexes go here"}
    )


def parse_args(argv=None) -> Settings:
    return parse(Settings, argv, prog="bench_step_limit.py", description=__doc__)


def index_for(catalogue, folder: Path) -> SIDIndex:
    if (folder / JSON_NAME).is_file():
        return SIDIndex.load(folder)
    vectors = np.random.default_rng(0).normal(size=(len(catalogue.items), 64)).astype(np.float32)
    return build_sids(
        catalogue, folder, vectors=vectors, levels=3, codes=64, encoder_fingerprint={"kind": "gaussian"}
    )


def collate(rows: list[dict], pad_id: int, padding_free: bool = False) -> dict[str, torch.Tensor]:
    """A batch as the trainer's collator (TRL's ``DataCollatorForLanguageModeling``) builds it from rows cut to
    ``MAX_LENGTH`` tokens, the loss on the completion mask's tokens: right-padded rows with an attention mask,
    or (``padding_free``) the rows concatenated into one with position ids restarting at each row."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    examples = []
    for r in rows:
        ids, keep = r["input_ids"][:MAX_LENGTH], r["completion_mask"][:MAX_LENGTH]
        examples.append(
            {"input_ids": ids, "labels": [t if m else -100 for t, m in zip(ids, keep, strict=True)]}
        )
    batch = DataCollatorForLanguageModeling(pad_token_id=pad_id, padding_free=padding_free)(examples)
    return {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}


def real_tokens(batch: dict[str, torch.Tensor]) -> int:
    mask = batch.get("attention_mask")
    return int(batch["input_ids"].numel() if mask is None else mask.sum())


def linear_shapes(model: torch.nn.Module) -> list[tuple[int, int]]:
    """``(out_features, in_features)`` of every frozen linear layer of the decoder blocks (LoRA-wrapped ones
    by their base layer), the head excluded."""
    shapes = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and ".layers." in name and "lora_" not in name:
            shapes.append(tuple(module.weight.shape))
    if not shapes:
        raise ValueError("no linear layer found in the model's decoder blocks")
    return shapes


def products_seconds(
    shapes: list[tuple[int, int]], tokens: int, dtype: torch.dtype, repeats: int = 5
) -> float:
    """The best of ``repeats`` timings of every layer's forward (``x @ W.T``) and input-gradient (``g @ W``)
    products for ``tokens`` rows, in ``dtype``: what a step over those tokens cannot do faster."""
    generator = torch.Generator().manual_seed(0)
    operands = []
    for out_features, in_features in shapes:
        weight = torch.randn(out_features, in_features, generator=generator).to(dtype)
        x = torch.randn(tokens, in_features, generator=generator).to(dtype)
        grad = torch.randn(tokens, out_features, generator=generator).to(dtype)
        operands.append((weight, x, grad))

    def once() -> float:
        start = time.perf_counter()
        for weight, x, grad in operands:
            torch.mm(x, weight.t())
            torch.mm(grad, weight)
        return time.perf_counter() - start

    once()  # warm-up
    return min(once() for _ in range(repeats))


def products_flop(shapes: list[tuple[int, int]], tokens: int) -> float:
    return sum(2 * 2 * tokens * o * i for o, i in shapes)


def measure(base: str, catalogue, index, bf16: bool, args) -> dict:
    from trl.trainer.utils import add_fused_lm_head

    dtype = torch.bfloat16 if bf16 else torch.float32
    tokenizer, model = sid_model(base, index, start=RowStart(init="centroid", init_scale=0.1), dtype=dtype)
    add_lora(model, r=8, lora_alpha=16, target_modules="all-linear")
    for p in model.parameters():  # master weights of what trains stay float32, as the trainer keeps them
        if p.requires_grad:
            p.data = p.data.float()
    add_fused_lm_head(model.get_base_model(), outputs=("log_probs", "entropy", "is_top1"))
    model.train()
    fmt = PromptFormat(objective="sequence", max_history=HISTORY)
    data = training_dataset(catalogue.leave_one_out(), index, catalogue, tokenizer, fmt)
    rng = random.Random(0)
    samples = [[data[i] for i in rng.sample(range(len(data)), BATCH)] for _ in range(args.steps + 1)]
    pad = tokenizer.pad_token_id or 0
    batches = {free: [collate(rows, pad, free) for rows in samples] for free in (False, True)}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.0)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext()

    def step(batch: dict[str, torch.Tensor], variant: Variant) -> tuple[float, float]:
        """One step, timed inside the variant's set-up (which the trainer enters once per run)."""
        attention = training_attention(
            model, float32=bf16, per_sequence=variant.per_sequence
        )  # the trainer's
        lora, compiled = fused_lora(model, variant.fused), compiled_blocks(model, variant.compiled)
        with attention, lora, compiled, float32_stream(model, variant.stream):
            start = time.perf_counter()
            optimizer.zero_grad()
            with autocast, compact_head(model, sid_ids=model.base_model.grounded_token_ids()):
                out = model(**batch, fused_lm_head=True, use_cache=False)
            out.loss.backward()
            optimizer.step()
            seconds = time.perf_counter() - start
        return seconds, float(out.loss)

    variants = [
        v for v in VARIANTS if (not v.compiled or compile_problem() is None) and (bf16 or not v.stream)
    ]
    times: dict[Variant, list[float]] = {v: [] for v in variants}
    losses: dict[Variant, list[float]] = {v: [] for v in variants}
    for variant in variants:  # warm-up (and compiling)
        step(batches[variant.padding_free][0], variant)
    for i in range(1, args.steps + 1):  # the variants take turns, so a busy machine slows them alike
        for variant in variants if i % 2 else reversed(variants):
            seconds, loss = step(batches[variant.padding_free][i], variant)
            times[variant].append(seconds)
            losses[variant].append(loss)
    real = statistics.median(real_tokens(b) for b in batches[False][1:])
    padded = statistics.median(b["input_ids"].numel() for b in batches[False][1:])
    shapes = linear_shapes(model)
    limit_real = products_seconds(shapes, int(real), dtype, args.repeats)
    return {
        "precision": "bf16 (base bf16, autocast), float32 attention" if bf16 else "float32",
        "steps": {v.label: statistics.median(times[v]) for v in variants},
        "loss_gaps": {
            v.label: max(abs(a - b) for a, b in zip(losses[v], losses[VARIANTS[0]], strict=True))
            for v in variants
        },
        "real": real,
        "padded": padded,
        "limit_real": limit_real,
        "limit_padded": products_seconds(shapes, int(padded), dtype, args.repeats),
        "gflops": products_flop(shapes, int(real)) / limit_real / 1e9,
        "layers": len(shapes),
    }


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    with suppress(OSError, StopIteration):
        return next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    return platform.processor() or platform.machine()


def main(argv=None) -> None:
    args = parse_args(argv)
    precisions = [False] + ([True] if choose_precision("cpu").bf16 else [])
    base = str(shallow_base(assets.smollm2(), BLOCKS, args.output / f"base-{BLOCKS}"))
    load = os.getloadavg()[0]
    rows = []
    for dataset in args.datasets:
        catalogue = load_catalogue(dataset)
        index = index_for(catalogue, args.output / f"sids-{Path(dataset).name}")
        for bf16 in precisions:
            rows.append({"dataset": Path(dataset).name} | measure(base, catalogue, index, bf16, args))
    cpu = cpu_name()
    print(
        f"\n{cpu}, get_cpu_capability() {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} "
        f"thread(s), load average {load:.2f} at start, {os.getloadavg()[0]:.2f} at end; {args.steps} timed steps "
        f"(median), products best of {args.repeats}; {rows[0]['layers']} linear layers in {BLOCKS} blocks\n"
    )
    print("| catalogue | precision | real / padded tokens | products, real s | products, padded s |")
    print("|---|---|---|---:|---:|")
    for r in rows:
        print(
            f"| {r['dataset']} | {r['precision']} | {r['real']:.0f} / {r['padded']:.0f} | {r['limit_real']:.3f} | "
            f"{r['limit_padded']:.3f} |"
        )
    print(
        "\n| catalogue | precision | step | s | x products (real) | x faster than padded | loss gap to padded |"
    )
    print("|---|---|---|---:|---:|---:|---:|")
    for r in rows:
        padded_step = r["steps"][VARIANTS[0].label]
        for label, seconds in r["steps"].items():
            print(
                f"| {r['dataset']} | {r['precision']} | {label} | {seconds:.3f} | {seconds / r['limit_real']:.1f}x | "
                f"{padded_step / seconds:.2f}x | {r['loss_gaps'][label]:.1e} |"
            )
    speeds = ", ".join(f"{r['gflops']:.0f}" for r in rows)
    print(f"\nproducts at real tokens: {speeds} GFLOP/s")


if __name__ == "__main__":
    main()
