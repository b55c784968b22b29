"""RQ-KMeans scale and speed: wall time, CPU time and peak memory of ``fit_rqkmeans``.

Each configuration runs in its own subprocess, so its peak RSS is its own. Results go to stdout as a
markdown table (and, with ``--json``, to a file).

    python benchmarks/bench_rqkmeans.py                       # 100k x 384 random, 3 x 256
    python benchmarks/bench_rqkmeans.py --scaling             # 25k / 50k / 100k: memory linear in items?
    python benchmarks/bench_rqkmeans.py --balanced all --sample-size 65536
    python benchmarks/bench_rqkmeans.py --office              # the Amazon Office catalogue (MiniLM vectors)
    python benchmarks/bench_rqkmeans.py --faiss               # the same with faiss.Kmeans (if installed)

The index's settings are ``build-sids``' own, parsed from ``BuildSIDsArguments`` under its flags and with its
defaults: ``--levels`` (None: 3, or the length of ``--codes``), ``--codes`` (one number or a list),
``--balanced``, ``--sample_size``, ``--normalize_residuals`` and ``--seed`` (the k-means'; the random
vectors are always seed 0's).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from peft_grounded.cli.sids import BuildSIDsArguments

try:
    from benchmarks._args import package_fields, parse
except ModuleNotFoundError:  # run as a file: its folder is on sys.path, not the repository
    from _args import package_fields, parse

OFFICE = Path(__file__).resolve().parents[2] / "shared" / "data" / "amazon-office"


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _vectors(spec: dict):
    import numpy as np

    if spec["data"] == "random":
        rng = np.random.default_rng(0)
        return rng.standard_normal((spec["n"], spec["dim"]), dtype=np.float32)
    return np.load(spec["vectors_file"])


def encode_office(office_dir: str, out: str) -> None:
    """MiniLM vectors of the Office catalogue (default template), through the embedding cache, to ``out``."""
    import numpy as np

    from peft_grounded.sids import load_catalogue
    from peft_grounded.sids.catalogue import TextTemplate
    from peft_grounded.sids.encoders import SentenceTransformerEncoder, encode_texts

    catalogue = load_catalogue(office_dir)
    texts = TextTemplate().render_all(list(catalogue.items.values()))
    np.save(out, encode_texts(texts, SentenceTransformerEncoder(), show_progress=False))


def _faiss_rq(x, codes_per_level, seed: int, niter: int):
    import faiss
    import numpy as np

    residual = x.copy()
    codes = np.empty((len(x), len(codes_per_level)), dtype=np.int64)
    for level, k in enumerate(codes_per_level):
        km = faiss.Kmeans(x.shape[1], k, niter=niter, seed=seed + level, verbose=False)
        km.train(residual)
        _, labels = km.index.search(residual, 1)
        codes[:, level] = labels[:, 0]
        residual -= km.centroids[labels[:, 0]]
    return codes, residual


def worker(spec: dict) -> dict:
    import numpy as np
    import torch

    from peft_grounded.sids.collisions import collision_stats, level_usage
    from peft_grounded.sids.quantizers import RQKMeansConfig, fit_rqkmeans

    x = _vectors(spec)
    levels = tuple(spec["codes_per_level"])
    base_rss = _rss_mb()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    if spec["impl"] == "faiss":
        codes, residual = _faiss_rq(x, levels, spec["seed"], spec["faiss_niter"])
        iterations = [spec["faiss_niter"]] * len(levels)
    else:
        cfg = RQKMeansConfig(
            codes_per_level=levels,
            balanced=spec["balanced"],
            sample_size=spec["sample_size"],
            seed=spec["seed"],
            normalize_residuals=spec["normalize_residuals"],
        )
        fit = fit_rqkmeans(x, cfg)
        codes, residual = fit.codes.numpy(), fit.residual.numpy()
        iterations = [s["iterations"] for s in fit.stats]
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    peak = _peak_mb()  # before the figures below allocate anything
    input_mse = float((x.astype(np.float64) ** 2).sum(1).mean())
    return {
        **spec,
        "n": len(x),
        "dim": x.shape[1],
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "threads": torch.get_num_threads(),
        "input_mb": round(x.nbytes / 2**20, 1),
        "peak_rss_mb": round(peak, 1),
        "peak_above_input_mb": round(peak - base_rss, 1),
        "iterations": iterations,
        "relative_error": round(float((residual.astype(np.float64) ** 2).sum(1).mean()) / input_mse, 4),
        "collision_rate": round(collision_stats(codes).collision_rate, 4),
        "normalized_entropy": [
            level_usage(codes[:, lv], k)["normalized_entropy"] for lv, k in enumerate(levels)
        ],
    }


def run(spec: dict) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--worker", json.dumps(spec)], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def levels_by_codes(per_level: list[int]) -> str:
    """``3 x 256``, or ``256/256/512`` where the levels differ."""
    if len(set(per_level)) == 1:
        return f"{len(per_level)} x {per_level[0]}"
    return "/".join(map(str, per_level))


def table(rows: list[dict]) -> str:
    head = (
        "| data | n x d | levels x K | impl | balanced | sample | wall s | CPU s | iters/level | "
        "peak RSS MiB (above input) | rel. error | collisions | norm. entropy |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(
            f"| {r['data']} | {r['n']:,} x {r['dim']} | {levels_by_codes(r['codes_per_level'])} | {r['impl']} | "
            f"{r['balanced'] if r['impl'] == 'torch' else '-'} | {r['sample_size'] or 'all'} | {r['wall_s']} | "
            f"{r['cpu_s']} | {'/'.join(map(str, r['iterations']))} | {r['peak_rss_mb']:.0f} "
            f"({r['peak_above_input_mb']:.0f}) | {r['relative_error']:.3f} | {r['collision_rate']:.2%} | "
            f"{'/'.join(f'{e:.2f}' for e in r['normalized_entropy'])} |"
        )
    return "\n".join(lines)


@dataclass
class Settings:
    """The vectors and the runs; the index's settings are ``build-sids``' (:data:`SIDFields`), parsed beside."""

    n: int = field(default=100_000, metadata={"help": "random vectors"})
    dim: int = field(default=384, metadata={"help": "their dimension"})
    scaling: bool = field(default=False, metadata={"help": "also 25k and 50k items (memory vs n)"})
    office: bool = field(
        default=False, metadata={"help": "the Amazon Office catalogue instead of random vectors"}
    )
    office_dir: str = field(default=str(OFFICE), metadata={"help": "where the Office catalogue is"})
    faiss: bool = field(
        default=False, metadata={"help": "add faiss.Kmeans residual quantisation (same shape)"}
    )
    faiss_niter: int = field(default=20, metadata={"help": "faiss.Kmeans iterations per level"})
    json: str | None = field(default=None, metadata={"help": "also write the rows to this JSON file"})


# the fields of build-sids' settings the runs set, as the package declares them (its defaults too)
SIDFields = package_fields(
    BuildSIDsArguments, "levels", "codes", "balanced", "sample_size", "normalize_residuals", "seed"
)


def codes_per_level(sids) -> list[int]:
    """``--levels`` and ``--codes`` as ``build_sids`` reads them: the codes of each level."""
    counts = BuildSIDsArguments.code_counts(sids)  # the package's reading of --codes
    if isinstance(counts, int):
        return [counts] * (3 if sids.levels is None else sids.levels)
    if sids.levels is not None and sids.levels != len(counts):
        raise SystemExit(f"--levels {sids.levels} but --codes lists {len(counts)} levels ({sids.codes})")
    return counts


def parse_args(argv=None) -> tuple:
    """The settings and build-sids' settings parsed beside them (``args, sids``)."""
    return parse(
        (Settings, SIDFields),
        argv,
        prog="bench_rqkmeans.py",
        description=__doc__,
        check=lambda args, sids: codes_per_level(sids),
    )


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    # the subprocesses: no parser imported, so that their peak memory is the quantiser's (or the encoder's)
    if argv[:1] == ["--worker"]:
        print(json.dumps(worker(json.loads(argv[1]))))
        return
    if argv[:1] == ["--encode-office"]:
        encode_office(*argv[1:3])
        return
    args, sids = parse_args(argv)
    spec = {
        "data": "office" if args.office else "random",
        "office": args.office_dir,
        "n": args.n,
        "dim": args.dim,
        "codes_per_level": codes_per_level(sids),
        "balanced": sids.balanced,
        "sample_size": sids.sample_size,
        "normalize_residuals": sids.normalize_residuals,
        "seed": sids.seed,
        "impl": "torch",
        "faiss_niter": args.faiss_niter,
    }
    if args.office:  # encode in its own process, so the workers' peak memory is the quantiser's alone
        import tempfile

        spec["vectors_file"] = str(Path(tempfile.mkdtemp()) / "office.npy")
        subprocess.run(
            [sys.executable, __file__, "--encode-office", args.office_dir, spec["vectors_file"]], check=True
        )
    specs = [spec]
    if args.scaling and not args.office:
        specs = [spec | {"n": n} for n in (args.n // 4, args.n // 2)] + specs
    if args.faiss:
        specs += [s | {"impl": "faiss"} for s in specs]
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(f"# {os.cpu_count()} CPUs, load average before: {' '.join(load)}", file=sys.stderr)
    rows = []
    for s in specs:
        rows.append(run(s))
        print(json.dumps(rows[-1]), file=sys.stderr)
    with open("/proc/loadavg") as f:
        print(f"# load average after: {' '.join(f.read().split()[:3])}", file=sys.stderr)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
