"""New items without retraining, measured: the evaluation protocol of issue 12.

    OMP_NUM_THREADS=1 python benchmarks/bench_grow_protocol.py --out runs/grow-ml100k          # ~30-35 min
    OMP_NUM_THREADS=1 python benchmarks/bench_grow_protocol.py --out runs/grow-smoke --smoke   # ~2-3 min

Defaults (one CPU thread, SmolLM2-135M): the ``sequence`` objective (SID-only chunks of 20 items,
every item a target; ``max_length`` 128), LoRA r 8 / alpha 16 on all linear layers + the new rows, lr
1e-3, batch 8, a bfloat16 base under bf16 autocast, and a *time* budget: ``--minutes`` of SFT (and
``--grounding-minutes`` of grounding for a grounding strategy) for each of the two trained models, so the
old-catalogue model and the full-catalogue reference get the same wall-clock. The plan (what runs, for
how long) is printed first.

1. Hold out the catalogue's newest ``--share`` of items (by first interaction: RecBole timestamps when
   the catalogue has them, else the earliest relative position in a user's sequence).
2. Build SIDs on the rest (MiniLM, 3 x 64 + disambiguation) and train the ``--strategy``
   (init -> [grounding] -> LoRA SFT) on the interactions with those items only.
3. Add the held-out items (``SIDIndex.add_items``), grow the trained adapter (``grow_adapter``, centroid
   rows for the new tokens).
4. Score ALL test users whose (leave-one-out, full catalogue) target is a new item (``--users N`` caps
   them to a seeded sample, for smoke runs only), with the same ``PromptFormat`` as training:
   Recall/NDCG@K with a 95% bootstrap interval of the mean for: the grown model; the grown model after
   incremental grounding (``ground_new_items``); a model retrained from scratch on the full catalogue at
   the same budget (the upper reference); popularity over the training targets (which cannot rank a new
   item). Paired bootstrap intervals (the same resampled users for both rows) of the differences grown -
   retrained and grown+incremental - grown. Also the share of the top-K slots that go to new items.

Writes ``<out>/protocol.json`` (with per-user ranks of the target) and ``<out>/protocol.md``; training
runs resume (``<out>/old``, ``<out>/full``).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from collections import Counter
from pathlib import Path

import numpy as np

from peft_grounded import assets
from peft_grounded.adapter import grow_adapter
from peft_grounded.decoding import SIDTrie, recommend
from peft_grounded.evaluation.metrics import ranking_metrics
from peft_grounded.evaluation.users import item_token_ids
from peft_grounded.grounding.incremental import ground_new_items
from peft_grounded.models import sid_model
from peft_grounded.prompts import PromptFormat, inference_prompts
from peft_grounded.recommend import Budget, Experiment, run_strategy
from peft_grounded.sids import build_sids, load_catalogue
from peft_grounded.sids.encoders import encode_texts, load_encoder
from peft_grounded.sids.text import TextTemplate


def first_seen(catalogue, dataset: str) -> dict[str, float]:
    """Per item, the time of its first interaction (RecBole timestamps), else a position proxy."""
    directory = assets.movielens_100k() if dataset == "movielens-100k" else Path(dataset)
    inter = sorted(Path(directory).glob("*.inter")) if Path(directory).is_dir() else []
    if inter:
        lines = inter[0].read_text().splitlines()
        header = [h.split(":")[0] for h in lines[0].split("\t")]
        if "timestamp" in header:
            i_item, i_time = header.index("item_id"), header.index("timestamp")
            seen: dict[str, float] = {}
            for line in lines[1:]:
                cells = line.split("\t")
                item, stamp = cells[i_item], float(cells[i_time])
                seen[item] = min(seen.get(item, math.inf), stamp)
            return {i: seen.get(i, math.inf) for i in catalogue.items}
    seen = {}
    for seq in catalogue.sequences.values():
        for pos, item in enumerate(seq):
            seen[item] = min(seen.get(item, math.inf), pos / max(len(seq), 1))
    return {i: seen.get(i, math.inf) for i in catalogue.items}


def bootstrap(values: list[float], seed: int = 0, rounds: int = 1000) -> tuple[float, float]:
    """95% percentile interval of the mean."""
    if not values:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    data = np.asarray(values, dtype=np.float64)
    means = data[rng.integers(0, len(data), (rounds, len(data)))].mean(1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def score(predictions: list[list[str]], targets: list[str], new: set[str], k: int) -> dict:
    per_user_recall = [float(t in p[:k]) for p, t in zip(predictions, targets, strict=True)]
    per_user_ndcg = [
        1.0 / math.log2(p[:k].index(t) + 2) if t in p[:k] else 0.0
        for p, t in zip(predictions, targets, strict=True)
    ]
    metrics = ranking_metrics([p[:k] for p in predictions], targets, (k,))
    slots = [i for p in predictions for i in p[:k]]
    return {
        f"recall@{k}": metrics[f"recall@{k}"],
        f"recall@{k}_ci95": bootstrap(per_user_recall),
        f"ndcg@{k}": metrics[f"ndcg@{k}"],
        f"ndcg@{k}_ci95": bootstrap(per_user_ndcg),
        "new_item_slot_share": sum(i in new for i in slots) / max(len(slots), 1),
        "users": len(targets),
    }


def decode(model, tokenizer, examples, index, catalogue, fmt, k: int) -> list[list[str]]:
    _, prompts, _ = inference_prompts(examples, index, tokenizer, catalogue, fmt)
    trie = SIDTrie(item_token_ids(tokenizer, index))
    return recommend(model, tokenizer, prompts, trie, k=k, num_beams=k, batch_size=8).items


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", default="movielens-100k")
    parser.add_argument("--out", required=True)
    parser.add_argument("--share", type=float, default=0.1, help="newest share of items held out")
    parser.add_argument("--strategy", default="centroid")
    parser.add_argument("--levels", type=int, default=3)
    parser.add_argument("--codes", type=int, default=64)
    parser.add_argument("--grounding-steps", type=int, default=4)
    parser.add_argument("--sft-steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--incremental-steps", type=int, default=20)
    parser.add_argument(
        "--max-examples", type=int, default=256, help="sample of SFT and grounding examples (0: all)"
    )
    parser.add_argument("--users", type=int, default=16, help="new-item-target test users scored")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model_path = str(assets.smollm2())

    catalogue = load_catalogue(args.dataset)
    seen = first_seen(catalogue, args.dataset)
    order = sorted(catalogue.items, key=lambda i: (seen[i], i))
    n_new = max(1, round(args.share * len(order)))
    old_ids, new_ids = order[:-n_new], order[-n_new:]
    new = set(new_ids)
    old_catalogue = catalogue.subset(old_ids)

    encoder, template = load_encoder("minilm"), TextTemplate()
    vectors = encode_texts(template.render_all(list(catalogue.items.values())), encoder, show_progress=False)
    row = {i: r for r, i in enumerate(catalogue.items)}
    settings = dict(levels=args.levels, codes=args.codes, text_template=template, show_progress=False)
    fp = encoder.fingerprint()
    parent = build_sids(
        old_catalogue,
        vectors=vectors[[row[i] for i in old_catalogue.items]],
        encoder_fingerprint=fp,
        **settings,
    )
    start = time.perf_counter()
    child = parent.add_items(
        [catalogue.items[i] for i in new_ids], vectors=vectors[[row[i] for i in new_ids]], encoder=fp
    )
    add_seconds = time.perf_counter() - start
    full_index = build_sids(catalogue, vectors=vectors, encoder_fingerprint=fp, **settings)

    fmt = PromptFormat()
    budget = Budget(
        grounding_steps=args.grounding_steps,
        sft_steps=args.sft_steps,
        batch_size=args.batch_size,
        seed=args.seed,
        eval_users=4,
        show_progress=False,
        save_steps=max(args.grounding_steps, args.sft_steps, 1),
        max_train_examples=args.max_examples or None,
        max_grounding_examples=args.max_examples or None,
    )
    run_strategy(
        args.strategy,
        Experiment(model_path, old_catalogue, parent, fmt=fmt),
        budget,
        out / "old",
        resume=True,
    )
    run_strategy(
        args.strategy,
        Experiment(model_path, catalogue, full_index, fmt=fmt),
        budget,
        out / "full",
        resume=True,
    )

    split = catalogue.leave_one_out()
    pool = [e for e in split.test_examples(fmt.max_history) if e[2] in new]
    examples = random.Random(args.seed).sample(pool, min(args.users, len(pool)))
    targets = [e[2] for e in examples]
    results: dict[str, dict] = {}

    tokenizer, model = sid_model(model_path, parent, adapter=str(out / "old" / "sft" / "adapter"))
    grown = grow_adapter(model, tokenizer, parent, child)
    grown.eval()
    results["grown"] = score(
        decode(grown, tokenizer, examples, child, catalogue, fmt, args.k), targets, new, args.k
    )
    inc = ground_new_items(
        grown, tokenizer, parent, child, catalogue, steps=args.incremental_steps, batch_size=args.batch_size
    )
    grown.eval()
    results["grown + incremental grounding"] = score(
        decode(grown, tokenizer, examples, child, catalogue, fmt, args.k), targets, new, args.k
    ) | {"incremental_seconds": round(inc.seconds, 2), "incremental_rows": len(inc.trained_rows)}
    del grown, model

    tokenizer, full = sid_model(model_path, full_index, adapter=str(out / "full" / "sft" / "adapter"))
    full.eval()
    results["retrained (full catalogue)"] = score(
        decode(full, tokenizer, examples, full_index, catalogue, fmt, args.k), targets, new, args.k
    )
    counts = Counter(old_catalogue.leave_one_out().training_target_counts())
    top = [i for i, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[: args.k]]
    results["popularity"] = score([top] * len(targets), targets, new, args.k)

    summary = {
        "dataset": catalogue.name,
        "items": len(order),
        "new_items": n_new,
        "new_item_test_users": len(pool),
        "scored_users": len(examples),
        "add_items_seconds": round(add_seconds, 3),
        "new_tokens": child.n_tokens - parent.n_tokens,
        "budget": vars(args),
        "results": results,
    }
    (out / "protocol.json").write_text(json.dumps(summary, indent=1))
    k = args.k
    lines = [
        f"## New items on {catalogue.name}: {n_new} newest items held out, {len(examples)} of {len(pool)} "
        f"new-item test users scored",
        "",
        f"| model | Recall@{k} [95% CI] | NDCG@{k} [95% CI] | share of slots to new items |",
        "|---|---|---|---|",
    ]
    for name, r in results.items():
        lo, hi = r[f"recall@{k}_ci95"]
        nlo, nhi = r[f"ndcg@{k}_ci95"]
        lines.append(
            f"| {name} | {r[f'recall@{k}']:.4f} [{lo:.4f}, {hi:.4f}] | {r[f'ndcg@{k}']:.4f} [{nlo:.4f}, {nhi:.4f}] "
            f"| {r['new_item_slot_share']:.3f} |"
        )
    lines += [
        "",
        f"add_items: {add_seconds:.3f} s, {summary['new_tokens']} new tokens; incremental grounding: "
        f"{inc.seconds:.1f} s over {len(inc.trained_rows)} rows.",
    ]
    (out / "protocol.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
