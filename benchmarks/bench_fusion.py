"""The grounded LLM's lists fused with SASRec's, against the simplest control: SASRec fused with a second SASRec.

    OMP_NUM_THREADS=1 python benchmarks/bench_fusion.py --out runs/i54/fusion \
        --llm runs/i52/test-h60-s0 runs/i52/test-h60-s1 --sids runs/i52/h60-s0/sids runs/i52/h60-s1/sids --seeds 0 1

DLLM2Rec (arXiv 2405.00338) found that an LLM recommender's top lists and an ID-based sequential recommender's
overlap little: each hits users the other misses. This measures what that is worth on the test users of a
``peft-grounded evaluate`` output (``--llm``, one per seed, its 20-item lists with the history left out):

- ``sasrec``: SASRec at its best validation epoch on the same training split, the seed's fit (the one the
  behaviour SIDs and the distillation teacher read: ``sids.sasrec_cache.shared_fit``, trained once and cached);
- ``sasrec2``: another SASRec, seed + ``--partner-offset``, the control: an ensemble of two SASRecs;
- ``llm+sasrec`` and ``sasrec+sasrec2``: reciprocal rank fusion (Cormack et al., SIGIR 2009) of the two
  top-``--depth`` lists, ``sum 1 / (k + rank)`` with ``k`` = ``--rrf-k`` and 1-based ranks, equal weights:
  nothing is tuned, on validation or test.

Each arm's per-user records go to ``<out>/<arm>-s<seed>/users.json`` (``pool_arms.py`` reads them), and the
table pairs every arm per user against SASRec, seeds pooled (``pool_arms``' intervals: users resampled within
seed).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from peft_grounded.training.runs import write_json_atomic

try:
    from benchmarks import pool_arms
    from benchmarks._args import parse
except ModuleNotFoundError:  # run as a file: its folder is on sys.path, not the repository
    import pool_arms
    from _args import parse

ARMS = ("sasrec", "llm", "sasrec2", "llm+sasrec", "sasrec+sasrec2")


def reciprocal_rank_fusion(lists: Sequence[Sequence[str]], k: float, depth: int) -> list[str]:
    """The ``depth`` best items of ``lists`` (each best first, cut at ``depth``) by ``sum 1 / (k + rank)`` over
    the lists that hold them (1-based ranks); ties keep the first list's order, then the next's."""
    if k < 0:
        raise ValueError(f"the fusion's k is >= 0, got {k}")
    scores: dict[str, float] = {}
    for items in lists:
        for rank, item in enumerate(items[:depth], start=1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
    order = {item: i for i, item in enumerate(scores)}  # first seen: the first list, then the next
    return sorted(scores, key=lambda item: (-scores[item], order[item]))[:depth]


def llm_lists(folder: Path, part: str) -> dict[str, dict]:
    """user -> record (``items``: its list) of a ``peft-grounded evaluate`` output."""
    path = folder / "users.json"
    if not path.is_file():
        raise SystemExit(f"{folder}: not a peft-grounded evaluate output (no users.json)")
    records = json.loads(path.read_text()).get(part)
    if not records:
        raise SystemExit(f"{path} holds no {part!r} records")
    if any("items" not in r for r in records):
        raise SystemExit(f"{path}: its records hold no lists ('items'); rerun peft-grounded evaluate")
    return {r["user"]: r for r in records}


@dataclass
class Settings:
    out: str = field(metadata={"help": "each arm's users.json per seed goes here"})
    llm: list[str] = field(
        default_factory=list, metadata={"help": "peft-grounded evaluate outputs, one per seed"}
    )
    sids: list[str] = field(default_factory=list, metadata={"help": "each seed's SID index (its item ids)"})
    seeds: list[int] = field(default_factory=lambda: [0, 1], metadata={"help": "the seeds, in --llm's order"})
    dataset: str = field(
        default="movielens-100k", metadata={"help": "the catalogue the LLM was evaluated on"}
    )
    part: str = field(default="test", metadata={"help": "the users compared (the --llm outputs' part)"})
    rrf_k: float = field(default=60.0, metadata={"help": "reciprocal rank fusion's k"})
    depth: int = field(default=20, metadata={"help": "the length of each fused list"})
    partner_offset: int = field(default=100, metadata={"help": "the control SASRec's seed: seed + this"})

    def __post_init__(self) -> None:
        if not (len(self.llm) == len(self.sids) == len(self.seeds) > 0):
            raise SystemExit(
                f"give one --llm output and one --sids index per seed: {len(self.llm)} outputs, "
                f"{len(self.sids)} indexes, {len(self.seeds)} seeds"
            )
        if self.depth < 10:
            raise SystemExit(f"--depth {self.depth}: the fused lists are scored at 10, so depth >= 10")
        if self.partner_offset == 0:
            raise SystemExit("--partner-offset 0 would fuse SASRec with itself; give another seed offset")


def fused_arms(
    llm: dict[str, dict], split, items: Sequence[str], seed: int, args: Settings, sasrec=None
) -> dict[str, list[dict]]:
    """arm -> per-user records of one seed, on ``llm``'s users (user -> its evaluate record) in its order;
    ``sasrec``: the SASRec settings (None: the defaults, as the behaviour SIDs and the teacher fit it)."""
    from dataclasses import replace

    from peft_grounded.evaluation import EvalSettings
    from peft_grounded.evaluation.metrics import target_rank
    from peft_grounded.evaluation.reports import sampled_users
    from peft_grounded.sids.sasrec import SASRecConfig
    from peft_grounded.sids.sasrec_cache import shared_fit

    examples, _, _ = sampled_users(split, args.part, EvalSettings(users=None, cold=False), set(), None)
    history = {user: list(h) for user, h, _ in examples}
    users = list(llm)
    missing = [u for u in users if u not in history]
    if missing:
        raise SystemExit(f"users {missing[:3]} of the LLM's records are not {args.part} users of the split")
    config = sasrec or SASRecConfig()
    fits = {
        name: shared_fit(split, items, replace(config, seed=s))
        for name, s in (("sasrec", seed), ("sasrec2", seed + args.partner_offset))
    }
    histories = [history[u] for u in users]
    lists = {name: fit.recommend(histories, args.depth) for name, fit in fits.items()}
    lists["llm"] = [llm[u]["items"][: args.depth] for u in users]
    for first, second in (("llm", "sasrec"), ("sasrec", "sasrec2")):
        lists[f"{first}+{second}"] = [
            reciprocal_rank_fusion(pair, args.rrf_k, args.depth)
            for pair in zip(lists[first], lists[second], strict=True)
        ]
    out: dict[str, list[dict]] = {}
    for arm in ARMS:
        records = []
        for user, ranked in zip(users, lists[arm], strict=True):
            record = {k: llm[user][k] for k in ("user", "target", "all", "cold")}
            records.append({**record, "rank": target_rank(ranked[:10], record["target"]), "items": ranked})
        out[arm] = records
    drift = [r["user"] for r in out["llm"] if r["rank"] != _rank10(llm[r["user"]])]
    if drift:
        raise SystemExit(f"the LLM's lists disagree with its recorded ranks for users {drift[:3]}")
    return out


def _rank10(record: dict) -> int | None:
    rank = record.get("rank")
    return rank if rank is not None and rank < 10 else None


def main(argv=None) -> None:
    args = parse(Settings, argv, prog="bench_fusion.py", description=__doc__)
    from peft_grounded.sids import SIDIndex, load_catalogue

    out = Path(args.out)
    split = load_catalogue(args.dataset).leave_one_out()
    for llm_dir, sids, seed in zip(args.llm, args.sids, args.seeds, strict=True):
        items = list(SIDIndex.load(sids).item_ids)
        for arm, records in fused_arms(llm_lists(Path(llm_dir), args.part), split, items, seed, args).items():
            write_json_atomic(out / f"{arm}-s{seed}" / "users.json", {args.part: records})
    pool_arms.main(
        ["--part", args.part]
        + [f"{arm}=" + ",".join(str(out / f"{arm}-s{s}") for s in args.seeds) for arm in ARMS]
    )


if __name__ == "__main__":
    main()
