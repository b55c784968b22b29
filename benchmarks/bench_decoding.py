"""Seconds per user of the SID-constrained beam search (and of the target likelihood) on SmolLM2-135M.

    OMP_NUM_THREADS=1 python benchmarks/bench_decoding.py --users 40 --engines generate fast fast+nll --likelihood

Engines: ``generate`` (transformers' beam search, the path before), ``fast`` (decoding/beam.py), and
``fast+nll`` (the fast search also scoring each user's target from the same prompt cache, as
``evaluation.evaluate`` does); ``--likelihood`` adds the separate teacher-forced likelihood pass
(what an evaluation of rankings + likelihood cost before, on top of ``generate``); ``fast+sid`` is the fast
search under the SID-only softmax (each step computes the head's SID rows only, as for an adapter trained
with ``sid_softmax``: its lists differ from the full head's by construction, the normalisation differs).

SIDs for MovieLens-100K (all-MiniLM-L6-v2 + RQ-KMeans 3 x 64 + a disambiguation level, cached under
``--output``), a fresh centroid-initialised adapter (mean init would tie every SID token) with a LoRA
(r 8, all linear), the seeded test users' inference prompts, 20 beams, top 20. Each engine decodes the
same users; the table gives seconds per user (wall, best of the interleaved rounds, and the process's CPU
time, which other jobs on a shared machine disturb less) and the share of users whose top-20 list equals
the first engine's. bf16 weights and autocast where the CPU runs bf16 natively, else float32 (as the demo and the quality
benchmark; ``--fp32`` / ``--bf16`` force one). ``--max_history`` is the package's (``SFTArguments``), 8 items
here by default.
"""

from __future__ import annotations

import os
import random
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch

from peft_grounded import assets
from peft_grounded.adapter import add_lora
from peft_grounded.cli.common import SFTArguments
from peft_grounded.decoding import SIDTrie, recommend
from peft_grounded.evaluation import item_token_ids
from peft_grounded.prompts import PromptFormat, inference_prompts
from peft_grounded.sids import SIDIndex, build_sids, load_catalogue
from peft_grounded.sids.extended_base import RowStart, sid_model
from peft_grounded.sids.index import JSON_NAME

try:
    from benchmarks._args import Precision, package_fields, parse
except ModuleNotFoundError:  # run as a file: its folder is on sys.path, not the repository
    from _args import Precision, package_fields, parse

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the generate reference
from helpers.generate_reference import generate_recommend


@dataclass(kw_only=True)
class Settings(Precision):
    """What is decoded, by which engines (``--fp32`` / ``--bf16``: the weights' precision and autocast)."""

    users: int = field(default=40, metadata={"help": "seeded test users decoded"})
    engines: list[str] = field(
        default_factory=lambda: ["generate", "fast"],
        metadata={"help": "generate, fast, fast+nll, fast+sid (see above)"},
    )
    batch_size: int = field(default=16, metadata={"help": "prompts per decoding batch"})
    beams: int = field(default=20, metadata={"help": "beams of the search"})
    likelihood: bool = field(default=False, metadata={"help": "also time target_log_likelihood"})
    rounds: int = field(default=2, metadata={"help": "timed rounds per engine, interleaved"})
    fp32_reference: bool = field(
        default=False, metadata={"help": "also compare each bf16 engine's lists with fp32 decoding"}
    )
    output: Path = field(
        default=Path("runs/bench_decoding"), metadata={"help": "the SID index is cached here"}
    )


# the prompt's history, as the package declares it (SFTArguments); this benchmark's default 8 items
PromptFields = package_fields(SFTArguments, "max_history")
DEFAULTS = {"max_history": 8}


def prompt_format(prompt) -> PromptFormat:
    """The prompts' format: ``--max_history`` read as the package reads it (None: its default)."""
    return PromptFormat(max_history=SFTArguments(max_history=prompt.max_history).prompt_format().max_history)


def parse_args(argv=None) -> tuple:
    """The settings and the package's prompt field parsed beside them: ``args, prompt``."""
    return parse(
        (Settings, PromptFields),
        argv,
        prog="bench_decoding.py",
        description=__doc__,
        check=lambda args, prompt: f"{args}\n{prompt} ({prompt_format(prompt)})",
        defaults=DEFAULTS,
    )


def main(argv=None) -> None:
    args, prompt = parse_args(argv)
    args.fp32 = not args.choice().bf16

    catalogue = load_catalogue("movielens-100k")
    sid_dir = args.output / "sids"
    if (sid_dir / JSON_NAME).is_file():
        index = SIDIndex.load(sid_dir)
    else:
        index = build_sids(
            catalogue,
            sid_dir,
            levels=3,
            codes=64,
            text_template=["title", "brand", "categories", "release_year", "description"],
        )
    dtype = torch.float32 if args.fp32 else torch.bfloat16
    tokenizer, model = sid_model(str(assets.smollm2()), index, start=RowStart(init="centroid"), dtype=dtype)
    add_lora(model, r=8, lora_alpha=16)
    model.eval()
    split = catalogue.leave_one_out()
    fmt = prompt_format(prompt)
    examples = list(split.test_examples(fmt.max_history))
    examples = random.Random(0).sample(examples, min(args.users, len(examples)))
    _, prompts, targets = inference_prompts(examples, index, tokenizer, catalogue, fmt)
    sids = item_token_ids(tokenizer, index)
    trie = SIDTrie(sids)
    autocast = nullcontext() if args.fp32 else torch.autocast("cpu", dtype=torch.bfloat16)
    threads = torch.get_num_threads()
    load = os.getloadavg()[0]
    timings: dict[str, list[tuple[float, float]]] = {engine: [] for engine in args.engines}
    lists: dict[str, list] = {}
    values: dict[str, list] = {}
    for _ in range(args.rounds):  # rounds interleave the engines: drift in the machine's load hits all alike
        for engine in args.engines:
            with autocast:
                wall, cpu = time.perf_counter(), time.process_time()
                if engine == "generate":  # transformers' beam search: the tests' reference engine
                    recs = generate_recommend(
                        model,
                        tokenizer,
                        prompts,
                        trie,
                        k=20,
                        num_beams=args.beams,
                        batch_size=args.batch_size,
                    )
                else:  # the package's engine (fast, fast+nll, fast+sid)
                    recs = recommend(
                        model,
                        tokenizer,
                        prompts,
                        trie,
                        k=20,
                        num_beams=args.beams,
                        batch_size=args.batch_size,
                        targets=[sids[x] for x in targets] if engine.endswith("+nll") else None,
                        sid_softmax=engine.endswith("+sid"),
                    )
                timings[engine].append((time.perf_counter() - wall, time.process_time() - cpu))
            lists[engine] = recs.items
            values[engine] = recs.scores
    reference = None
    if args.fp32_reference and not args.fp32:  # how far each bf16 engine's lists are from exact arithmetic
        _, exact = sid_model(
            str(assets.smollm2()), index, start=RowStart(init="centroid"), dtype=torch.float32
        )
        add_lora(exact, r=8, lora_alpha=16)  # B = 0: the same function as the bf16 model, in fp32
        exact.eval()
        reference = recommend(exact, tokenizer, prompts, trie, k=20, num_beams=args.beams).items
    first = lists[args.engines[0]]
    rows = []
    for engine in args.engines:
        same = sum(a == b for a, b in zip(lists[engine], first, strict=True)) / len(first)
        top10 = sum(set(a[:10]) == set(b[:10]) for a, b in zip(lists[engine], first, strict=True)) / len(
            first
        )
        wall = min(t[0] for t in timings[engine]) / len(prompts)
        cpu = min(t[1] for t in timings[engine]) / len(prompts)
        # equal score lists with different items: the lists differ only in the order of tied items
        ties = sum(
            a != b and max(abs(x - y) for x, y in zip(sa, sb, strict=True)) < 1e-3
            for a, b, sa, sb in zip(
                lists[engine], first, values[engine], values[args.engines[0]], strict=True
            )
        ) / len(first)
        note = ""
        if reference is not None:
            agree = sum(set(a[:10]) == set(b[:10]) for a, b in zip(lists[engine], reference, strict=True))
            note = f"; top-10 sets equal to fp32's: {agree / len(reference):.0%}"
        rows.append(
            (
                engine,
                wall,
                cpu,
                f"{same:.0%} (top-10 sets: {top10:.0%}; same scores, tied items reordered: {ties:.0%}{note})",
            )
        )
    if args.likelihood:
        from peft_grounded.evaluation import target_log_likelihood

        with autocast:
            wall, cpu = time.perf_counter(), time.process_time()
            target_log_likelihood(
                model, tokenizer, prompts, [sids[x] for x in targets], trie, args.batch_size
            )
            rows.append(
                (
                    "likelihood",
                    (time.perf_counter() - wall) / len(prompts),
                    (time.process_time() - cpu) / len(prompts),
                    "-",
                )
            )
    print(
        f"\n{len(prompts)} ML-100K test users, {args.beams} beams, batch {args.batch_size}, "
        f"{'fp32' if args.fp32 else 'bf16'}, {threads} thread(s), load average {load:.2f} at start\n"
    )
    print(
        "| engine | wall s / user (best round) | CPU s / user | users whose top-20 equals the first engine's |"
    )
    print("|---|---:|---:|---|")
    for engine, wall, cpu, same in rows:
        print(f"| {engine} | {wall:.3f} | {cpu:.3f} | {same} |")


if __name__ == "__main__":
    main()
