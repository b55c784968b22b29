"""Decoding a trained adapter merged or not, in float32 or bf16: users per second and whether the lists are
float32's (issue 42, item 5: is bf16 decoding slow for its overhead, or different for its precision?).

    OMP_NUM_THREADS=1 python benchmarks/bench_decoding_precision.py --run runs/i40/text-s0 --users 160

``--run``: a demo run folder (its ``sids`` and its one strategy's SFT adapter). The four recommenders take
the same test-time histories (training items and the validation item) in turns, 32 users at a time, so a busy machine slows all alike; the lists
are compared with the unmerged float32 ones, which ``evaluate`` measures.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

try:
    from benchmarks._args import parse
except ModuleNotFoundError:  # run as a file: its folder is on sys.path, not the repository
    from _args import parse


@dataclass
class Settings:
    run: Path = field(metadata={"help": "a demo run folder (its sids and its one strategy's SFT adapter)"})
    users: int = field(default=160, metadata={"help": "validation users decoded by each recommender"})


def main(argv=None) -> None:
    args = parse(Settings, argv, prog="bench_decoding_precision.py", description=__doc__)
    from peft_grounded import GroundedRecommender
    from peft_grounded.sids import SIDIndex, index_catalogue

    (adapter,) = sorted(args.run.glob("strategies/*/sft/adapter"))
    index = SIDIndex.load(args.run / "sids")
    split = index_catalogue(index).leave_one_out()
    histories = [[*u.history, u.valid] for u in split.users[: args.users]]  # test-time histories
    recommenders = {
        f"{'merged' if merge else 'unmerged'} {dtype}": GroundedRecommender.from_pretrained(
            adapter, sid_index=index, dtype=dtype, merge=merge, num_beams=20, batch_size=16
        )
        for dtype in ("float32", "bfloat16")
        for merge in (False, True)
    }
    seconds = dict.fromkeys(recommenders, 0.0)
    lists: dict[str, list] = {name: [] for name in recommenders}
    for start in range(0, len(histories), 32):
        for name, recommender in recommenders.items():
            began = time.perf_counter()
            out = recommender.recommend(histories[start : start + 32], k=10)
            seconds[name] += time.perf_counter() - began
            lists[name] += [list(r.items) for r in out]
    reference = lists["unmerged float32"]
    print("| decoding | users/s | top-10 lists equal to unmerged float32's | top-10 sets equal |")
    print("|---|---:|---:|---:|")
    for name in recommenders:
        same = sum(a == b for a, b in zip(lists[name], reference, strict=True)) / len(reference)
        sets = sum(set(a) == set(b) for a, b in zip(lists[name], reference, strict=True)) / len(reference)
        print(f"| {name} | {len(reference) / seconds[name]:.2f} | {same:.2f} | {sets:.2f} |")


if __name__ == "__main__":
    main()
