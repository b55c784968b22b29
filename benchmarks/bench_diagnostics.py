"""Time the diagnostics at full size: SmolLM2-135M's 49,152 x 576 vocabulary and 4 x 256 SID tokens.

    python benchmarks/bench_diagnostics.py [--out DIR] [--snapshots 3]

Builds a synthetic SID index (4 x 256 codes over random 768-d item vectors, so the centroid init
truncates), saves ``mean``, ``gaussian`` and ``centroid`` adapters on the real SmolLM2 (from
:func:`peft_grounded.assets.smollm2`, offline), then times loading the vocabulary, measuring each
snapshot and writing the whole report with :func:`~peft_grounded.diagnostics.diagnose`.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

try:
    from benchmarks._args import parse
except ModuleNotFoundError:  # run as a file: its folder is on sys.path, not the repository
    from _args import parse

INITS = ("mean", "gaussian", "centroid")


def synthetic_index(n_items: int = 20_000, levels: int = 4, codes: int = 256, dim: int = 768, seed: int = 0):
    """A SID index with random codes and clustered item vectors (timings do not depend on the values)."""
    from peft_grounded.sids.index import SIDIndex

    rng = np.random.default_rng(seed)
    item_codes = rng.integers(0, codes, size=(n_items, levels))
    vectors = rng.normal(size=(codes, dim))[item_codes[:, 0]] + 0.5 * rng.normal(size=(n_items, dim))
    centroids = np.zeros((levels * codes, dim))
    for level in range(levels):
        sums = np.zeros((codes, dim))
        np.add.at(sums, item_codes[:, level], vectors)
        counts = np.bincount(item_codes[:, level], minlength=codes)[:, None]
        centroids[level * codes : (level + 1) * codes] = sums / np.maximum(counts, 1)
    return SIDIndex(
        item_ids=[str(i) for i in range(n_items)],
        codes=item_codes,
        codes_per_level=(codes,) * levels,
        codebooks=[centroids[lv * codes : (lv + 1) * codes].astype(np.float32) for lv in range(levels)],
        centroids={"items": centroids.astype(np.float32), "codebook": centroids.astype(np.float32)},
        item_interactions=rng.zipf(1.6, size=n_items).clip(max=5000),
        item_categories=[(f"cat{c % 20}",) for c in item_codes[:, 0]],
    )


def save_adapters(base: Path, index, out: Path, inits: tuple[str, ...]) -> list[Path]:
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from peft_grounded import GroundedTokenConfig, add_tokens

    paths = []
    for init in inits:
        tokenizer = AutoTokenizer.from_pretrained(base)
        model = AutoModelForCausalLM.from_pretrained(base)
        new = add_tokens(tokenizer, model, index.token_strings)
        vectors = index.adapter_init("items")[1] if init == "centroid" else None
        config = GroundedTokenConfig(
            token_indices=new, init=init, init_vectors=vectors, task_type="CAUSAL_LM"
        )
        get_peft_model(model, config).save_pretrained(out / init)
        paths.append(out / init)
    return paths


@dataclass
class Settings:
    out: str | None = field(
        default=None, metadata={"help": "where to keep the adapters and the report (None: a temporary dir)"}
    )
    snapshots: Literal[1, 2, 3] = field(default=3, metadata={"help": "adapters to compare"})


def main(argv: list[str] | None = None) -> None:
    import torch

    from peft_grounded import assets
    from peft_grounded.diagnostics import (
        GeometrySnapshot,
        ReportConfig,
        diagnose,
        load_sid_rows,
        load_vocabulary,
        measure_snapshots,
    )
    from peft_grounded.diagnostics.diagnose import level0_labels, token_frequencies

    args = parse(Settings, argv, prog="bench_diagnostics.py", description=__doc__)
    out = Path(args.out or tempfile.mkdtemp(prefix="diagnostics-bench-"))
    print(f"torch threads {torch.get_num_threads()}; files in {out}")
    base = assets.smollm2()
    index = synthetic_index()
    paths = save_adapters(base, index, out, INITS[: args.snapshots])

    t = time.perf_counter()
    vocabulary = load_vocabulary(base, 49152)
    print(f"load vocabulary {tuple(vocabulary.rows.shape)}: {time.perf_counter() - t:.2f} s")
    rows = [load_sid_rows(p, index.token_strings).rows for p in paths]
    reference = index.centroids["items"]
    snapshots = [
        GeometrySnapshot(
            p.name,
            r,
            index.token_strings,
            vocab_rows=vocabulary.rows,
            vocab_tokens=vocabulary.tokens,
            exclude_vocab_ids=vocabulary.special_ids,
            reference=reference,
            frequencies=token_frequencies(index, "interactions"),
            categories=level0_labels(index) + [None] * (index.n_tokens - 256),
        )
        for p, r in zip(paths, rows, strict=True)
    ]
    t = time.perf_counter()
    measure_snapshots(snapshots, ReportConfig())
    measured = time.perf_counter() - t
    print(f"measure {len(snapshots)} snapshots: {measured:.2f} s ({measured / len(snapshots):.2f} s each)")
    t = time.perf_counter()
    files = diagnose(paths, index, out_dir=out / "report")
    total = time.perf_counter() - t
    print(
        f"diagnose end to end (load, measure, plots, report): {total:.2f} s ({total / len(paths):.2f} s each)"
    )
    print(f"report: {files.markdown}")


if __name__ == "__main__":
    main()
