"""Serving speed: `GroundedRecommender.recommend` against transformers' own beam search, same model, same trie.

    OMP_NUM_THREADS=1 python benchmarks/bench_recommend.py --blocks 8 30 --users 12 --batch-users 32

For each base (the first ``--blocks`` decoder blocks of SmolLM2-135M, ``training/sft/recommendation_trainer.py``): a
centroid-initialised grounded adapter with a LoRA (r 8), recorded as trained under the SID-only softmax as
``sft`` trains by default (``--full-vocabulary``: decoded over the whole vocabulary), on SIDs of ML-100K (seeded Gaussian item vectors
through RQ-KMeans 3 x 64 + a disambiguation level: 4 tokens per SID, 1,682 items; the speed does not depend
on what the vectors mean), saved and loaded back with ``GroundedRecommender.from_pretrained`` (adapter
merged). Two engines on that one model object:

* ``recommender``: ``GroundedRecommender.recommend(k=10, exclude_history=False)`` (the package's
  constrained beam search, ``decoding/beam.py``);
* ``generate``: ``model.generate(num_beams=20, num_return_sequences=10)`` over the same trie, greedy, no
  length penalty: with ``prefix_allowed_tokens_fn`` (``SIDTrie.allowed_tokens``), the path users find first,
  or, under the SID-only softmax, the tests' ``SIDConstraintLogitsProcessor`` renormalising each step (the
  ``generate`` reference of ``tests/helpers/generate_reference.py``).

The unmerged adapter (``merge=False``) decodes the batch once more: its lists must be the merged default's.

Both see the same prompts (the adapter's prompt format, seeded ML-100K test histories), 20 beams. Batch 1:
each user decoded alone, the engines alternating user by user (per-user latency p50 / p95). Batch 32: the
same ``--batch-users`` users in one call per engine, alternating over ``--rounds`` rounds (users per
second, best round). The top-10 lists are compared user by user (identical, and the mean overlap).
Other jobs on the machine slow both engines alike within a round; the load average is printed. ``--dtype`` is
``peft-grounded recommend``'s (``RecommendArguments``: the loaded model's weights), float32 here by default.
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from transformers import LogitsProcessorList

from peft_grounded import assets
from peft_grounded.adapter import add_lora
from peft_grounded.cli.recommend import RecommendArguments
from peft_grounded.decoding.search import left_pad
from peft_grounded.prompts import inference_prompts
from peft_grounded.serving import GroundedRecommender
from peft_grounded.sids import SIDIndex, load_catalogue
from peft_grounded.sids.extended_base import SID_RECORD, RowStart, save_sid_record, sid_model
from peft_grounded.training.sft.recommendation_trainer import record_sid_softmax, shallow_base

try:
    from benchmarks._args import package_fields, parse
    from benchmarks.bench_step_limit import index_for
except ModuleNotFoundError:  # run as a file: its folder is on sys.path, not the repository
    from _args import package_fields, parse
    from bench_step_limit import index_for

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the generate reference
from helpers.generate_reference import SIDConstraintLogitsProcessor, isolated_generation


@dataclass
class Settings:
    blocks: list[int] = field(
        default_factory=lambda: [8, 30], metadata={"help": "decoder blocks kept, one base each (30: all)"}
    )
    users: int = field(default=12, metadata={"help": "users decoded one at a time (batch 1)"})
    batch_users: int = field(default=32, metadata={"help": "users in the batched call"})
    rounds: int = field(default=2, metadata={"help": "batched rounds per engine, alternating"})
    beams: int = field(default=20, metadata={"help": "beams of both engines"})
    full_vocabulary: bool = field(
        default=False, metadata={"help": "an adapter decoded over the whole vocabulary"}
    )
    output: Path = field(
        default=Path("runs/bench_recommend"),
        metadata={"help": "the SID index, cut bases and adapters go here"},
    )


# the loaded model's dtype and the lists' length, as the package's recommend command declares them; float32 here
ServingFields = package_fields(RecommendArguments, "dtype", "k")
DEFAULTS = {"dtype": "float32"}


def parse_args(argv=None) -> Settings:
    """The settings, the package's dtype and list length set on them (``args.dtype``, ``args.k``)."""
    args, serving = parse(
        (Settings, ServingFields), argv, prog="bench_recommend.py", description=__doc__, defaults=DEFAULTS
    )
    args.dtype, args.k = serving.dtype, serving.k
    return args


def adapter_for(base: Path, index: SIDIndex, folder: Path, sid_softmax: bool) -> Path:
    """The recipe's adapter: centroid rows, a LoRA (r 8), trained under the SID-only softmax (``sft``'s
    default) unless ``--full-vocabulary``; the speed does not depend on the weights' values."""
    if not (folder / SID_RECORD).is_file():  # the record says how it decodes: PEFT's save_pretrained drops it
        _, model = sid_model(str(base), index, start=RowStart(init="centroid"))
        add_lora(model, r=8, lora_alpha=16)
        record_sid_softmax(model, sid_softmax)
        model.save_pretrained(folder)
        save_sid_record(model, folder)
    return folder


def generate_top(recommender: GroundedRecommender, prompts: list[str], beams: int, k: int) -> list[list[str]]:
    """transformers' beam search over the recommender's trie: ``prefix_allowed_tokens_fn`` for a model
    decoded over the whole vocabulary; for one trained under the SID-only softmax, the package's logits
    processor, which renormalises each step over the SID rows before constraining it."""
    model, tokenizer, trie = recommender.model, recommender.tokenizer, recommender.trie
    encoded = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    input_ids, mask = left_pad(encoded, pad)
    width = input_ids.shape[1]

    def allowed(_batch: int, ids: torch.Tensor) -> list[int]:
        return trie.allowed_tokens(ids[width:].tolist())

    constraint: dict = {"prefix_allowed_tokens_fn": allowed}
    if recommender.sid_rows is not False:
        rows = recommender.sid_rows
        constraint = {
            "logits_processor": LogitsProcessorList([SIDConstraintLogitsProcessor(trie, width, rows)])
        }
    with isolated_generation(model), torch.no_grad():
        out = model.generate(
            input_ids=input_ids,
            attention_mask=mask,
            num_beams=beams,
            num_return_sequences=k,
            max_new_tokens=trie.max_length,
            do_sample=False,
            length_penalty=0.0,
            early_stopping=False,
            pad_token_id=pad,
            **constraint,
        )
    new = out[:, width:].view(len(prompts), k, -1).tolist()
    return [[trie.item_of(seq[: trie.max_length]) for seq in user] for user in new]


def compare(a: list[list[str]], b: list[list[str]], k: int) -> tuple[float, float]:
    same = sum(x[:k] == y[:k] for x, y in zip(a, b, strict=True)) / len(a)
    overlap = sum(len(set(x[:k]) & set(y[:k])) / k for x, y in zip(a, b, strict=True)) / len(a)
    return same, overlap


def bench(blocks: int, args, catalogue, index, histories) -> dict:
    base = (
        shallow_base(assets.smollm2(), blocks, args.output / f"base-{blocks}")
        if blocks < 30
        else assets.smollm2()
    )
    name = "full" if args.full_vocabulary else "sid"
    adapter = adapter_for(base, index, args.output / f"adapter-{blocks}-{name}", not args.full_vocabulary)
    load = dict(sid_index=index, model_name_or_path=str(base), device="cpu", dtype=args.dtype)
    load |= dict(num_beams=args.beams, batch_size=args.batch_users)
    recommender = GroundedRecommender.from_pretrained(adapter, **load)  # merged, the default
    unmerged = GroundedRecommender.from_pretrained(adapter, merge=False, **load)
    examples = [(str(u), h, None) for u, h in enumerate(histories)]
    _, prompts, _ = inference_prompts(examples, index, recommender.tokenizer, None, recommender.fmt)
    ours = lambda hs: [r.items for r in recommender.recommend(hs, k=args.k, exclude_history=False)]  # noqa: E731
    ours(histories[:1]), generate_top(recommender, prompts[:1], args.beams, args.k)  # warm-up
    single = histories[: args.users]
    lat = {"recommender": [], "generate": []}
    lists = {"recommender": [], "generate": []}
    for u, history in enumerate(single):
        for engine in ("recommender", "generate") if u % 2 == 0 else ("generate", "recommender"):
            start = time.perf_counter()
            got = (
                ours([history])
                if engine == "recommender"
                else generate_top(recommender, [prompts[u]], args.beams, args.k)
            )
            lat[engine].append(time.perf_counter() - start)
            lists[engine].append(got[0])
    batch = histories[: args.batch_users]
    speed = {"recommender": [], "generate": []}
    batched = {}
    for r in range(args.rounds):
        for engine in ("recommender", "generate") if r % 2 == 0 else ("generate", "recommender"):
            start = time.perf_counter()
            got = (
                ours(batch)
                if engine == "recommender"
                else generate_top(recommender, prompts[: len(batch)], args.beams, args.k)
            )
            speed[engine].append(len(batch) / (time.perf_counter() - start))
            batched[engine] = got
    same1, over1 = compare(lists["recommender"], lists["generate"], args.k)
    same32, over32 = compare(batched["recommender"], batched["generate"], args.k)
    start = time.perf_counter()
    plain = [r.items for r in unmerged.recommend(batch, k=args.k, exclude_history=False)]
    unmerged_ups = len(batch) / (time.perf_counter() - start)
    return {
        "unmerged": (compare(batched["recommender"], plain, args.k)[0], unmerged_ups),
        "sid_softmax": recommender.sid_rows is not False,
        "blocks": blocks,
        "dtype": str(next(recommender.model.parameters()).dtype).removeprefix("torch."),
        "p50": {e: statistics.median(v) for e, v in lat.items()},
        "p95": {e: float(np.percentile(v, 95)) for e, v in lat.items()},
        "ups": {e: max(v) for e, v in speed.items()},
        "same": (same1, same32),
        "overlap": (over1, over32),
        "prompt_tokens": statistics.mean(len(recommender.tokenizer(p)["input_ids"]) for p in prompts),
    }


def main(argv=None) -> None:
    args = parse_args(argv)
    catalogue = load_catalogue("movielens-100k")
    index = index_for(catalogue, args.output / "sids")
    split = catalogue.leave_one_out()
    pool = list(split.test_examples(10))
    chosen = random.Random(0).sample(pool, max(args.users, args.batch_users))
    histories = [list(h) for _, h, _ in chosen]
    load = os.getloadavg()[0]
    rows = [bench(b, args, catalogue, index, histories) for b in args.blocks]
    end = os.getloadavg()[0]
    print(
        f"\n{torch.get_num_threads()} thread(s), {args.beams} beams, top {args.k}, load average {load:.2f} at start, "
        f"{end:.2f} at end; batch 1: {args.users} users; batch {args.batch_users}: best of {args.rounds} rounds\n"
    )
    print(
        "| blocks | dtype | engine | batch 1 p50 s | batch 1 p95 s | users/s at batch "
        f"{args.batch_users} | x generate (users/s) | top-10 identical (b1 / b{args.batch_users}) | mean overlap |"
    )
    print("|---:|---|---|---:|---:|---:|---:|---|---|")
    for r in rows:
        for engine in ("generate", "recommender"):
            ratio = r["ups"][engine] / r["ups"]["generate"]
            same = "-" if engine == "generate" else f"{r['same'][0]:.0%} / {r['same'][1]:.0%}"
            overlap = "-" if engine == "generate" else f"{r['overlap'][0]:.3f} / {r['overlap'][1]:.3f}"
            print(
                f"| {r['blocks']} | {r['dtype']} | {engine} | {r['p50'][engine]:.3f} | {r['p95'][engine]:.3f} "
                f"| {r['ups'][engine]:.2f} | {ratio:.2f}x | {same} | {overlap} |"
            )
    print(f"\nprompt tokens (mean): {statistics.mean(r['prompt_tokens'] for r in rows):.0f}")
    for r in rows:
        same, ups = r["unmerged"]
        print(
            f"{r['blocks']} blocks, SID-only softmax {r['sid_softmax']}: unmerged adapter {ups:.2f} users/s at "
            f"batch {args.batch_users}, top-{args.k} lists identical to the merged default's: {same:.0%}"
        )


if __name__ == "__main__":
    main()
