"""Item targets per second of the two training objectives on SmolLM2-135M (one thread by default).

    OMP_NUM_THREADS=1 python benchmarks/bench_objectives.py --sid-index SIDS_DIR [--steps 6]

Trains a few steps of each objective (``prompt``: chat prompt -> one SID; ``sequence``: SID-only chunks
of 20 items, every item after the first a target) with the recommendation trainer (LoRA r 8 on all
linear layers + the new rows, fp32 weights, bf16 autocast where the CPU has native bf16 (else float32),
batch 8) and reports item targets per training second from the trainer's own counters (``items_seen``, ``seconds``), the first step left out
(warm-up). Each objective trains on a seeded sample of its rows (tokenising all 97k prompt rows of
ML-100K takes minutes and does not change the speed).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from peft_grounded import assets
from peft_grounded.cli.common import DataArguments, load_data
from peft_grounded.prompts import PromptFormat
from peft_grounded.training.sft import RecommendationConfig, train_recommender

try:
    from benchmarks._args import Precision, package_fields, parse
except ModuleNotFoundError:  # run as a file: its folder is on sys.path, not the repository
    from _args import Precision, package_fields, parse


def measure(objective: str, catalogue, index, steps: int, batch_size: int, bf16: bool) -> dict:
    fmt = PromptFormat(objective=objective, max_history=19 if objective == "sequence" else 10)
    with tempfile.TemporaryDirectory() as tmp:
        args = RecommendationConfig(
            output_dir=tmp,
            max_steps=steps,
            per_device_train_batch_size=batch_size,
            learning_rate=1e-3,
            logging_steps=1,
            save_steps=10_000,
            bf16=bf16,
            use_cpu=not torch.cuda.is_available(),
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        train_recommender(
            catalogue,
            index,
            args,
            model_path=str(assets.smollm2()),
            fmt=fmt,
            lora=dict(r=8, lora_alpha=16, target_modules="all-linear"),
            max_examples=max(steps * batch_size * 4, 256),  # a seeded sample: tokenising all rows is slow
        )
        log = [e for e in json.loads((Path(tmp) / "log_history.json").read_text()) if "items_seen" in e]
    first, last = log[0], log[-1]
    items, seconds = last["items_seen"] - first["items_seen"], last["seconds"] - first["seconds"]
    return {
        "objective": objective,
        "steps": len(log) - 1,
        "items": items,
        "seconds": round(seconds, 2),
        "targets_per_s": round(items / seconds, 2),
    }


@dataclass(kw_only=True)
class Settings(Precision):
    """The steps of each objective (``--fp32``/``--no-bf16``, ``--bf16``: the precision); the SID index and
    catalogue trained on: the package's ``DataArguments`` fields (:data:`DataFields`)."""

    steps: int = field(default=6, metadata={"help": "training steps of each objective"})
    batch_size: int = field(default=8, metadata={"help": "rows per step"})


# --sid_index and --catalogue (None: the one the index records), as the package's commands declare them
DataFields = package_fields(DataArguments, "sid_index", "catalogue")


def parse_args(argv=None) -> tuple:
    """The settings and the SID index and catalogue parsed beside them (``a, data``)."""
    return parse((Settings, DataFields), argv, prog="bench_objectives.py", description=__doc__)


def main(argv=None) -> None:
    a, data = parse_args(argv)
    bf16 = a.choice().bf16
    torch.set_num_threads(torch.get_num_threads())
    catalogue, index = load_data(data.catalogue, data.sid_index)
    rows = [measure(o, catalogue, index, a.steps, a.batch_size, bf16) for o in ("prompt", "sequence")]
    print("| objective | steps | item targets | seconds | targets/s |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['objective']} | {r['steps']} | {r['items']} | {r['seconds']} | {r['targets_per_s']} |")
    print(f"sequence / prompt: {rows[1]['targets_per_s'] / rows[0]['targets_per_s']:.1f}x")


if __name__ == "__main__":
    main()
