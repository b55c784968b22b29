"""The user's history left out inside the beam search against the route it replaced (a 20-beam search, the
history dropped, a second search of 20 + history beams for every user left short): users per second, and
validation Recall@10 paired per user.

    OMP_NUM_THREADS=1 python benchmarks/bench_exclusion.py --run runs/i40/text-s0 --users 300
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

try:
    from benchmarks._args import parse
except ModuleNotFoundError:  # run as a file: its folder is on sys.path, not the repository
    from _args import parse


@dataclass
class Settings:
    run: Path = field(metadata={"help": "a demo run folder (its sids and its SFT adapter)"})
    users: int = field(default=300, metadata={"help": "the first N validation users"})


def left_out(items, scores, exclude, k):
    """The route it replaced: each row's first ``k`` items (and scores) that its ``exclude`` does not hold."""
    kept_items, kept_scores = [], []
    for row, values, seen in zip(items, scores, exclude, strict=True):
        pairs = [(i, s) for i, s in zip(row, values, strict=True) if i not in set(seen)][:k]
        kept_items.append([i for i, _ in pairs])
        kept_scores.append([s for _, s in pairs])
    return kept_items, kept_scores


def main(argv=None) -> None:
    args = parse(Settings, argv, prog="bench_exclusion.py", description=__doc__)
    from peft_grounded import GroundedRecommender
    from peft_grounded.decoding import recommend
    from peft_grounded.decoding.search import history_prompts
    from peft_grounded.intervals import bootstrap_interval
    from peft_grounded.sids import SIDIndex, load_catalogue

    (adapter,) = sorted(args.run.glob("strategies/*/sft/adapter"))
    index = SIDIndex.load(args.run / "sids")
    users = load_catalogue("movielens-100k").leave_one_out().users[: args.users]
    r = GroundedRecommender.from_pretrained(
        adapter, sid_index=index, dtype="float32", num_beams=20, batch_size=16
    )
    histories = [list(u.history) for u in users]  # validation time: the target is u.valid
    start = time.perf_counter()
    inside = [x.items for x in r.recommend(histories, k=10, exclude_history=True)]
    inside_s = time.perf_counter() - start
    start = time.perf_counter()
    prompts = history_prompts(histories, r.index, r.tokenizer, r.catalogue, r.fmt)
    found = recommend(r.model, r.tokenizer, prompts, r.trie, k=20, num_beams=20, sid_softmax=r.sid_rows)
    before, _ = left_out(found.items, found.scores, histories, 10)
    for u in [u for u, row in enumerate(before) if len(row) < 10]:
        wide = min(len(r.trie), 20 + sum(i in r.trie for i in set(histories[u])))
        again = recommend(
            r.model, r.tokenizer, [prompts[u]], r.trie, k=wide, num_beams=wide, sid_softmax=r.sid_rows
        )
        (before[u],), _ = left_out(again.items, again.scores, [histories[u]], 10)
    before_s = time.perf_counter() - start
    hits = {name: np.array([float(u.valid in row) for u, row in zip(users, lists, strict=True)])
            for name, lists in (("inside", inside), ("before", before))}  # fmt: skip
    ci = bootstrap_interval([hits["inside"] - hits["before"]])
    same = np.mean([set(a) == set(b) for a, b in zip(inside, before, strict=True)])
    print("| route | users/s | validation R@10 |")
    print("|---|---:|---:|")
    print(
        f"| history left out inside the search | {len(users) / inside_s:.2f} | {hits['inside'].mean():.4f} |"
    )
    print(
        f"| dropped afterwards, searched again wider | {len(users) / before_s:.2f} | {hits['before'].mean():.4f} |"
    )
    print(
        f"inside - before: {ci['difference']:+.4f} [{ci['low']:+.4f}, {ci['high']:+.4f}]; same top-10 sets: {same:.2f}"
    )


if __name__ == "__main__":
    main()
