"""Time and memory of adding items to a SID index (coding + writing a new version), encoder apart.

    python benchmarks/bench_grow.py                       # ML-100K (MiniLM, 3 x 64 + disambiguation), 1,000 items
    python benchmarks/bench_grow.py --dataset /work/shared/data/amazon-office --add 1000

The parent is the whole catalogue's index (the demo's settings); the new items are 1,000 items whose
vectors are existing items' vectors plus small noise (so many join existing SID groups and the
disambiguation level grows: the hardest case for coding). Reported apart: the encoder's own speed on
the catalogue's texts (items/s, cache off). Memory: the peak Python allocation (tracemalloc) of
``add_vectors`` for several batch sizes, per added item (linear when flat).

The parent index's settings are ``build-sids``' own, parsed from ``BuildSIDsArguments`` under its flags:
``--levels`` and ``--codes`` (one number or a list), the demo preset's levels and codes their defaults.
"""

from __future__ import annotations

import tempfile
import time
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from peft_grounded.cli.sids import BuildSIDsArguments
from peft_grounded.new_items.grow_index import GrowthReport, add_vectors
from peft_grounded.pipeline.demo import PRESETS
from peft_grounded.sids import build_sids, load_catalogue
from peft_grounded.sids.catalogue import TextTemplate
from peft_grounded.sids.encoders import encode_texts, load_encoder

try:
    from benchmarks._args import package_fields, parse
except ModuleNotFoundError:  # run as a file: its folder is on sys.path, not the repository
    from _args import package_fields, parse


def new_vectors(index, vectors: np.ndarray, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, len(vectors), n)
    return (vectors[rows] + 0.02 * rng.standard_normal((n, vectors.shape[1]))).astype(np.float32)


@dataclass
class Settings:
    dataset: str = field(default="movielens-100k", metadata={"help": "the catalogue (a name or a folder)"})
    add: int = field(default=1000, metadata={"help": "items to add"})
    encoder_sample: int = field(default=128, metadata={"help": "texts timed through the encoder"})
    repeats: int = field(default=3, metadata={"help": "timed additions (the best kept)"})


# the parent index's fields of build-sids' settings, as the package declares them; the demo preset's by default
SIDFields = package_fields(BuildSIDsArguments, "levels", "codes")
DEFAULTS = {"levels": PRESETS["default"].levels, "codes": str(PRESETS["default"].codes)}


def parse_args(argv=None) -> tuple:
    """The settings and the parent index's (the package's) parsed beside them: ``args, sids``."""
    return parse(
        (Settings, SIDFields),
        argv,
        prog="bench_grow.py",
        description=__doc__,
        check=lambda args, sids: f"{args}\n{sids} (codes per level: {BuildSIDsArguments.code_counts(sids)})",
        defaults=DEFAULTS,
    )


def main(argv=None) -> None:
    args, sids = parse_args(argv)

    catalogue = load_catalogue(args.dataset)
    encoder = load_encoder("minilm")
    template = TextTemplate()
    texts = template.render_all(list(catalogue.items.values()))
    vectors = encode_texts(texts, encoder, show_progress=False)  # cached after the first run
    index = build_sids(
        catalogue,
        vectors=vectors,
        encoder_fingerprint=encoder.fingerprint(),
        levels=sids.levels,
        codes=BuildSIDsArguments.code_counts(sids),  # the package's reading of --codes
        text_template=template,
        show_progress=False,
    )
    sample = texts[: args.encoder_sample]
    start = time.perf_counter()
    encode_texts(sample, encoder, use_cache=False, show_progress=False)
    encoder_rate = len(sample) / (time.perf_counter() - start)

    x = new_vectors(index, vectors, args.add)
    ids = [f"new-{i}" for i in range(args.add)]
    timings = []
    for _ in range(args.repeats):
        report = GrowthReport()
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            child = add_vectors(index, ids, x, encoder=encoder.fingerprint(), report=report)
            coded = time.perf_counter() - start
            child.save(Path(tmp) / "v2")
            total = time.perf_counter() - start
        timings.append((coded, total - coded))
    coded, written = min(t[0] for t in timings), min(t[1] for t in timings)

    memory = []
    for n in (args.add // 4, args.add // 2, args.add, args.add * 2):
        xs, ns = new_vectors(index, vectors, n, seed=n), [f"m-{i}" for i in range(n)]
        tracemalloc.start()
        add_vectors(index, ns, xs)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        memory.append((n, peak))

    print(
        f"## Adding {args.add} items to the {catalogue.name} SID index ({index.n_items} items, levels {list(index.codes_per_level)})"
    )
    print()
    print("| step | seconds |")
    print("|---|---|")
    print(f"| coding (quantise, disambiguate, centroids) | {coded:.3f} |")
    print(f"| writing the new version | {written:.3f} |")
    print(f"| **coding + writing** (target <= 2 s) | **{coded + written:.3f}** |")
    print(
        f"| encoder (MiniLM, apart): {encoder_rate:.1f} items/s -> {args.add / encoder_rate:.1f} s for {args.add} | |"
    )
    print()
    print(
        f"New tokens: {len(report.new_tokens)} (disambiguation level {index.codes_per_level[-1]} -> "
        f"{child.codes_per_level[-1]}); {report.shared_sid_groups} new items joined an existing SID group."
    )
    print()
    print("| items added | peak memory (MiB) | bytes per item |")
    print("|---|---|---|")
    for n, peak in memory:
        print(f"| {n} | {peak / 2**20:.2f} | {peak / n:.0f} |")


if __name__ == "__main__":
    main()
