"""Training step time and item targets/s with the full head vs the SID-only softmax, at equal batch.

    OMP_NUM_THREADS=1 python benchmarks/bench_sid_softmax.py --depths 8 30 [--fp32 | --bf16] [--rounds 4]

SmolLM2-135M cut to each of ``--depths`` decoder blocks (each a value of the package's ``--layers``,
``LoraModelConfig.layers``, through the same peft_grounded.training.sft.recommendation_trainer.shallow_base; 30 or 0 =
the whole model), a centroid-initialised adapter for MovieLens-100K SIDs (all-MiniLM-L6-v2 + RQ-KMeans 3 x 64 + a
disambiguation level, cached under ``--output``) with a LoRA (r 8, all linear), one batch of ``--batch-size``
sequence-objective rows (20 items, every item after the first a target). A step is what the trainer runs:
forward through TRL's fused head request with the compact path (labelled positions only), backward, AdamW;
``full`` normalises over the 49,152+ rows of the head, ``sid`` over the SID rows only
(``sid_softmax``). The two alternate step by step in one process after a warm-up step each, so a
machine shared with other jobs slows both alike; the table gives the median step, item targets/s and the
median of the per-round ratios, and the bytes of the float32 logits of the batch.

Float32 on AVX2 only: run with ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
MKL_ENABLE_INSTRUCTIONS=AVX2`` and ``--fp32``; ``--bf16``: bf16 autocast (fp32 master weights), as the
trainer does where the CPU has native bf16.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch

from peft_grounded import assets
from peft_grounded.adapter import add_lora
from peft_grounded.prompts import PromptFormat
from peft_grounded.sid_head import compact_head
from peft_grounded.sids import SIDIndex, build_sids, load_catalogue
from peft_grounded.sids.extended_base import RowStart, sid_model
from peft_grounded.sids.index import JSON_NAME
from peft_grounded.training.sft import training_dataset
from peft_grounded.training.sft.recommendation_trainer import shallow_base
from peft_grounded.training.steps import count_targets

try:
    from benchmarks._args import Precision, parse
except ModuleNotFoundError:  # run as a file: its folder is on sys.path, not the repository
    from _args import Precision, parse


@dataclass(kw_only=True)
class Settings(Precision):
    """The depths and batch timed (``--fp32`` / ``--bf16``: float32, or bf16 autocast)."""

    # the sweep: values of the package's --layers (LoraModelConfig.layers, one per run), not that setting itself
    depths: list[int] = field(
        default_factory=lambda: [8, 30],
        metadata={
            "help": "the decoder blocks kept, one timed run each (a value of --layers; 30 or 0: the whole model)"
        },
    )
    batch_size: int = field(default=8, metadata={"help": "sequence rows per batch"})
    rounds: int = field(default=4, metadata={"help": "timed steps per head, alternating"})
    output: Path = field(
        default=Path("runs/bench_sid_softmax"), metadata={"help": "the SID index and the cut bases go here"}
    )


def ml100k_index(catalogue, output: Path) -> SIDIndex:
    sid_dir = output / "sids"
    if (sid_dir / JSON_NAME).is_file():
        return SIDIndex.load(sid_dir)
    return build_sids(
        catalogue,
        sid_dir,
        levels=3,
        codes=64,
        text_template=["title", "brand", "categories", "release_year", "description"],
    )


def one_batch(rows, pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``/``attention_mask``/``labels`` (labels on the mask's SID tokens), as TRL's
    collator builds them."""
    width = max(len(r["input_ids"]) for r in rows)
    ids = torch.full((len(rows), width), pad_id)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        ids[i, :n] = torch.tensor(r["input_ids"])
        mask[i, :n] = 1
        labels[i, :n] = torch.where(torch.tensor(r["completion_mask"]) == 1, ids[i, :n], -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def measure(base: str, catalogue, index, args, bf16: bool) -> dict:
    from trl.trainer.utils import add_fused_lm_head

    tokenizer, model = sid_model(base, index, start=RowStart(init="centroid"), dtype=torch.float32)
    add_lora(model, r=8, lora_alpha=16, target_modules="all-linear")
    add_fused_lm_head(model.get_base_model(), outputs=("log_probs", "entropy", "is_top1"))
    model.train()
    fmt = PromptFormat(objective="sequence", max_history=19)
    data = training_dataset(catalogue.leave_one_out(), index, catalogue, tokenizer, fmt)
    rows = [data[i] for i in random.Random(0).sample(range(len(data)), args.batch_size)]
    batch = one_batch(rows, tokenizer.pad_token_id or 0)
    tokens, items = (int(v) for v in count_targets(batch["labels"]))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext()

    def step(sid: bool) -> float:
        start = time.perf_counter()
        optimizer.zero_grad()
        sid_ids = model.base_model.grounded_token_ids() if sid else None
        with autocast, compact_head(model, sid_ids=sid_ids):
            out = model(**batch, fused_lm_head=True)
        out.loss.backward()
        optimizer.step()
        return time.perf_counter() - start

    times: dict[bool, list[float]] = {False: [], True: []}
    step(False), step(True)  # warm-up
    for _ in range(args.rounds):
        for sid in (False, True):
            times[sid].append(step(sid))
    vocab = model.get_input_embeddings().base_layer.weight.shape[0]
    n_sid = model.base_model.grounded_token_ids().numel()
    full_s, sid_s = (statistics.median(times[k]) for k in (False, True))
    ratios = [f / s for f, s in zip(times[False], times[True], strict=True)]
    return {
        "layers": model.config.num_hidden_layers,
        "tokens": tokens,
        "items": items,
        "full_s": full_s,
        "sid_s": sid_s,
        "ratio": statistics.median(ratios),
        "ratio_range": (min(ratios), max(ratios)),
        "full_logits": tokens * vocab * 4,
        "sid_logits": tokens * n_sid * 4,
        "vocab": vocab,
        "n_sid": n_sid,
    }


def parse_args(argv=None) -> Settings:
    return parse(Settings, argv, prog="bench_sid_softmax.py", description=__doc__)


def main(argv=None) -> None:
    args = parse_args(argv)
    bf16 = args.choice().bf16
    catalogue = load_catalogue("movielens-100k")
    index = ml100k_index(catalogue, args.output)
    load = os.getloadavg()[0]
    results = []
    for layers in args.depths:
        base = str(assets.smollm2())
        if 0 < layers < 30:
            base = str(shallow_base(base, layers, args.output / f"base-{layers}"))
        results.append(measure(base, catalogue, index, args, bf16))
    isa = os.environ.get("ATEN_CPU_CAPABILITY", "default")
    print(
        f"\nbatch {args.batch_size} sequence rows, {'bf16 autocast' if bf16 else 'float32'}, ATEN_CPU_CAPABILITY={isa}, "
        f"{torch.get_num_threads()} thread(s), load average {load:.2f} at start, {args.rounds} timed steps per head\n"
    )
    print(
        "| blocks | item targets / batch | full: s / step | SID-only: s / step | full items/s | SID-only items/s "
        "| speed-up (median; range) | fp32 logits full -> SID-only |"
    )
    print("|---:|---:|---:|---:|---:|---:|---|---|")
    for r in results:
        lo, hi = r["ratio_range"]
        print(
            f"| {r['layers']} | {r['items']} | {r['full_s']:.3f} | {r['sid_s']:.3f} | {r['items'] / r['full_s']:.1f} "
            f"| {r['items'] / r['sid_s']:.1f} | {r['ratio']:.2f}x ({lo:.2f}-{hi:.2f}) "
            f"| {r['full_logits'] / 2**20:.1f} MiB -> {r['sid_logits'] / 2**20:.2f} MiB "
            f"({r['tokens']} x {r['vocab']} -> {r['tokens']} x {r['n_sid']}) |"
        )


if __name__ == "__main__":
    main()
