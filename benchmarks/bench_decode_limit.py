"""Serving against the machine's limit: `GroundedRecommender.recommend` timed beside the matrix products its
beam search must do.

    OMP_NUM_THREADS=1 python benchmarks/bench_decode_limit.py --batch-users 32 --rounds 3

The recipe's served model (SmolLM2-135M cut to its first 8 decoder blocks, a centroid-initialised adapter
with a LoRA, r 8, trained under the SID-only softmax, merged as ``from_pretrained`` loads it: the adapter of
``bench_recommend.py``), SIDs of ML-100K (seeded Gaussian item vectors through RQ-KMeans 3 x 64 + a
disambiguation level; the speed does not depend on what the vectors mean), seeded ML-100K test histories in
the adapter's prompt format, 20 beams, top 10, the history kept in the lists (``exclude_history=False``: the
search's own cost). In each precision this CPU runs natively (float32 always, the exact path whose lists are
``generate``'s; bf16 where :func:`peft_grounded.precision.choose_precision` finds it native) it times
``--rounds`` calls of ``recommend`` on ``--batch-users`` users (users per second, best round) and, in the
same run, the products such a search cannot avoid: every linear layer of the blocks, forward only, over the
prompts' real tokens (the prefill) and over ``users x beams`` rows for each beam step after the first SID token
(which the prompt's last position gives). Attention's own products and the SID head are small beside them and
left out, so the limit is a floor; 1.0x is the machine's limit for this model.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from peft_grounded import assets
from peft_grounded.precision import choose_precision
from peft_grounded.prompts import inference_prompts
from peft_grounded.serving import GroundedRecommender
from peft_grounded.sids import load_catalogue
from peft_grounded.training.sft.recommendation_trainer import shallow_base

try:
    from benchmarks._args import parse
    from benchmarks.bench_recommend import adapter_for
    from benchmarks.bench_step_limit import cpu_name, index_for, linear_shapes, products_flop
except ModuleNotFoundError:  # run as a file: its folder is on sys.path, not the repository
    from _args import parse
    from bench_recommend import adapter_for
    from bench_step_limit import cpu_name, index_for, linear_shapes, products_flop

BLOCKS = 8


@dataclass
class Settings:
    batch_users: int = field(default=32, metadata={"help": "users in each recommend call"})
    rounds: int = field(
        default=3, metadata={"help": "timed calls per precision (best kept), after one warm-up"}
    )
    beams: int = field(default=20, metadata={"help": "beams of the search"})
    k: int = field(default=10, metadata={"help": "items per list"})
    repeats: int = field(default=5, metadata={"help": "timings of the products alone (best kept)"})
    full_vocabulary: bool = field(
        default=False, metadata={"help": "an adapter decoded over the whole vocabulary (not the recipe's)"}
    )
    output: Path = field(
        default=Path("runs/bench_recommend"),
        metadata={"help": "the SID index, cut base and adapter go here (shared with bench_recommend.py)"},
    )


def parse_args(argv=None) -> Settings:
    return parse(Settings, argv, prog="bench_decode_limit.py", description=__doc__)


def search_rows(prompt_tokens: list[int], beams: int, levels: int) -> list[int]:
    """The row counts of the products a batched beam search runs through every linear layer: the prompts'
    tokens in one prefill (whose last positions give the first SID token), then ``users x beams`` rows for each
    of the other ``levels - 1`` tokens of a SID."""
    if levels < 1 or beams < 1 or not prompt_tokens:
        raise ValueError(f"a search needs prompts, beams >= 1 and levels >= 1 (got {beams}, {levels})")
    return [sum(prompt_tokens)] + [len(prompt_tokens) * beams] * (levels - 1)


def forward_products_seconds(
    shapes: list[tuple[int, int]], rows: list[int], dtype: torch.dtype, repeats: int = 5
) -> float:
    """The best of ``repeats`` timings of every layer's forward product (``x @ W.T``) for each row count in
    ``rows``, in ``dtype``: what a search over those rows cannot do faster."""
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(o, i, generator=generator).to(dtype) for o, i in shapes]
    inputs = {(n, i): torch.randn(n, i, generator=generator).to(dtype) for n in set(rows) for _, i in shapes}

    def once() -> float:
        start = time.perf_counter()
        for n in rows:
            for weight in weights:
                torch.mm(inputs[n, weight.shape[1]], weight.t())
        return time.perf_counter() - start

    once()  # warm-up
    return min(once() for _ in range(repeats))


def measure(base: Path, adapter: Path, index, histories: list[list[str]], dtype: str, args) -> dict:
    load = dict(sid_index=index, model_name_or_path=str(base), device="cpu", dtype=dtype)
    recommender = GroundedRecommender.from_pretrained(
        adapter, num_beams=args.beams, batch_size=len(histories), **load
    )
    examples = [(str(u), h, None) for u, h in enumerate(histories)]
    _, prompts, _ = inference_prompts(examples, index, recommender.tokenizer, None, recommender.fmt)
    tokens = [len(recommender.tokenizer(p)["input_ids"]) for p in prompts]
    recommender.recommend(histories[:2], k=args.k, exclude_history=False)  # warm-up
    seconds = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        recommender.recommend(histories, k=args.k, exclude_history=False)
        seconds.append(time.perf_counter() - start)
    shapes = linear_shapes(recommender.model)
    rows = search_rows(tokens, args.beams, index.n_levels)
    torch_dtype = next(recommender.model.parameters()).dtype
    limit = forward_products_seconds(shapes, rows, torch_dtype, args.repeats)
    flop = sum(products_flop(shapes, n) for n in rows) / 2  # forward only: half a step's fwd + input-grad
    best = min(seconds)
    return {
        "dtype": str(torch_dtype).removeprefix("torch."),
        "users": len(histories),
        "seconds": best,
        "limit": limit,
        "prompt_tokens": sum(tokens) / len(tokens),
        "rows": rows,
        "gflops": flop / limit / 1e9,
    }


def main(argv=None) -> None:
    args = parse_args(argv)
    catalogue = load_catalogue("movielens-100k")
    index = index_for(catalogue, args.output / "sids")
    base = shallow_base(assets.smollm2(), BLOCKS, args.output / f"base-{BLOCKS}")
    name = "full" if args.full_vocabulary else "sid"
    adapter = adapter_for(base, index, args.output / f"adapter-{BLOCKS}-{name}", not args.full_vocabulary)
    pool = list(catalogue.leave_one_out().test_examples(10))
    histories = [list(h) for _, h, _ in random.Random(0).sample(pool, args.batch_users)]
    dtypes = ["float32"] + (["bfloat16"] if choose_precision("cpu").bf16 else [])
    load = os.getloadavg()[0]
    rows = [measure(base, adapter, index, histories, dtype, args) for dtype in dtypes]
    cpu = cpu_name()
    print(
        f"\n{cpu}, get_cpu_capability() {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} "
        f"thread(s), load average {load:.2f} at start, {os.getloadavg()[0]:.2f} at end; {BLOCKS} blocks, "
        f"{args.beams} beams, top {args.k}, {'the whole vocabulary' if args.full_vocabulary else 'the SID rows'}, "
        f"{args.batch_users} users a call, best of {args.rounds} calls, "
        f"products best of {args.repeats}\n"
    )
    print(
        "| dtype | prompt tokens (mean) | rows per product (prefill, beam steps) | users/s | s per user | "
        "products s per user | x products | products GFLOP/s |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for r in rows:
        per_user, limit = r["seconds"] / r["users"], r["limit"] / r["users"]
        steps = ", ".join(str(n) for n in r["rows"][1:])
        print(
            f"| {r['dtype']} | {r['prompt_tokens']:.0f} | {r['rows'][0]}; {steps} | {r['users'] / r['seconds']:.2f} | "
            f"{per_user:.4f} | {limit:.4f} | {r['seconds'] / r['limit']:.1f}x | {r['gflops']:.0f} |"
        )


if __name__ == "__main__":
    main()
