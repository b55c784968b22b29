"""The grounded LLM's lists fused with SASRec's, against the simplest control: SASRec fused with a second SASRec.

    OMP_NUM_THREADS=1 python benchmarks/bench_fusion.py --out runs/i54/fusion-h60 \
        --valid runs/i52/h60-s0 runs/i52/h60-s1 --test runs/i52/test-h60-s0 runs/i52/test-h60-s1 \
        --sids runs/i52/h60-s0/sids runs/i52/h60-s1/sids --seeds 0 1 --partners 1 0

DLLM2Rec (arXiv 2405.00338) found that an LLM recommender's top lists and an ID-based sequential recommender's
overlap little: each hits users the other misses. This measures what fusing them is worth. The LLM's lists
(20 items with their log-probabilities, the history left out) come from its runner folder (``--valid``: the
validation users) and a ``peft-grounded evaluate`` output (``--test``), one of each per seed. Arms:

- ``sasrec``: SASRec at its best validation epoch on the same training split, the seed's fit (the one the
  behaviour SIDs and the distillation teacher read: ``sids.sasrec_cache.shared_fit``, trained once, cached);
- ``sasrec2``: another SASRec (seed ``--partners``), the control's second member;
- ``llm+sasrec``, ``sasrec+sasrec2``: reciprocal rank fusion (Cormack et al., SIGIR 2009) of the two
  top-``--depth`` lists, ``sum 1 / (k + rank)``, ``k`` = ``--rrf-k``, equal weights: nothing tuned;
- ``llm*sasrec``, ``sasrec*sasrec2``: a product of experts, ``log p_first(i) + w log p_second(i)``, over the
  LLM's list and SASRec's top ``--depth`` (an item outside the LLM's list gets its list's lowest
  log-probability; the served rule, :mod:`peft_grounded.serving.peer_fusion`); ``w`` from ``--weights``, chosen per seed on the validation users (Recall@10, then
  NDCG@10), then read on test.

Each arm's per-user records go to ``<out>/<part>/<arm>-s<seed>/users.json`` (``pool_arms.py`` reads them); the
tables pair every arm per user against SASRec, seeds pooled (users resampled within seed). ``--seeds`` is the
demo's (``DemoArguments``: the runs' seeds, each one's LLM run and SASRec fit), 0 and 1 here by default.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from peft_grounded.cli.demo import DemoArguments
from peft_grounded.serving.peer_fusion import product_of_experts
from peft_grounded.training.runs import write_json_atomic

try:
    from benchmarks import pool_arms
    from benchmarks._args import package_fields, parse
except ModuleNotFoundError:  # run as a file: its folder is on sys.path, not the repository
    import pool_arms
    from _args import package_fields, parse

ARMS = ("sasrec", "llm", "sasrec2", "llm+sasrec", "sasrec+sasrec2", "llm*sasrec", "sasrec*sasrec2")
PARTS = ("valid", "test")


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


def llm_records(folder: Path, part: str) -> dict[str, dict]:
    """user -> record (``items`` and ``scores``: its list) of a runner folder or an evaluate output."""
    records = pool_arms.arm_records(folder, part)
    if not records or any("items" not in r or "scores" not in r for r in records):
        raise SystemExit(f"{folder}: its {part} records hold no lists with scores ('items', 'scores')")
    return {r["user"]: r for r in records}


@dataclass
class Settings:
    out: str = field(metadata={"help": "each arm's users.json per part and seed goes here"})
    valid: list[str] = field(
        default_factory=list, metadata={"help": "the LLM's runner folders (validation lists), one per seed"}
    )
    test: list[str] = field(
        default_factory=list,
        metadata={"help": "the LLM's peft-grounded evaluate outputs (test), one per seed"},
    )
    sids: list[str] = field(default_factory=list, metadata={"help": "each seed's SID index (its item ids)"})
    partners: list[int] = field(
        default_factory=list,
        metadata={"help": "the control SASRec's seed, one per seed (none: each seed + 100)"},
    )
    dataset: str = field(
        default="movielens-100k", metadata={"help": "the catalogue the LLM was evaluated on"}
    )
    rrf_k: float = field(default=60.0, metadata={"help": "reciprocal rank fusion's k"})
    weights: list[float] = field(
        default_factory=lambda: [0.25, 0.5, 1.0, 2.0, 4.0],
        metadata={"help": "the product of experts' weights w, one chosen per seed on validation"},
    )
    depth: int = field(default=20, metadata={"help": "the length of each fused list"})
    subset: Literal["all", "warm", "cold"] = field(
        default="all",
        metadata={
            "help": "the tables' users: all (the seeded sample), warm or cold targets (pool_arms.py --subset)"
        },
    )

    def __post_init__(self) -> None:
        if self.depth < 10:
            raise SystemExit(f"--depth {self.depth}: the fused lists are scored at 10, so depth >= 10")
        if not self.weights or any(not (w > 0 and math.isfinite(w)) for w in self.weights):
            raise SystemExit(f"--weights are positive numbers, got {self.weights}")


# the runs' seeds, as the package declares them (the demo's --seeds); 0 and 1 here by default
SeedFields = package_fields(DemoArguments, "seeds")
DEFAULTS = {"seeds": [0, 1]}


def settle(args: Settings, seeds: list[int]) -> Settings:
    """``args`` with the runs' ``seeds`` set (``args.seeds``) and checked against the folders given, and the
    control's seeds settled (``--partners``; none: each seed + 100)."""
    if not (len(args.valid) == len(args.test) == len(args.sids) == len(seeds) > 0):
        raise SystemExit(
            "give one --valid folder, one --test output and one --sids index per seed: "
            f"{len(args.valid)}, {len(args.test)}, {len(args.sids)} for {len(seeds)} seeds"
        )
    args.seeds = list(seeds)
    args.partners = args.partners or [seed + 100 for seed in seeds]
    if len(args.partners) != len(seeds):
        raise SystemExit(f"give one --partners seed per seed: {len(args.partners)} for {len(seeds)} seeds")
    same = [seed for seed, partner in zip(seeds, args.partners, strict=True) if seed == partner]
    if same:
        raise SystemExit(f"--partners: seed {same[0]} would fuse SASRec with itself; give another seed")
    return args


def parse_args(argv=None) -> Settings:
    """The settings, the package's seeds set on them (``args.seeds``) and the partners settled."""
    args, _ = parse(
        (Settings, SeedFields),
        argv,
        prog="bench_fusion.py",
        description=__doc__,
        check=lambda args, runs: f"{settle(args, runs.seeds)}\n{runs}",
        defaults=DEFAULTS,
    )
    return args


def _records(llm: dict[str, dict], lists: Sequence[Sequence[str]]) -> list[dict]:
    from peft_grounded.evaluation.metrics import target_rank

    out = []
    for record, ranked in zip(llm.values(), lists, strict=True):
        kept = {k: record[k] for k in ("user", "target", "all", "cold")}
        out.append({**kept, "rank": target_rank(list(ranked)[:10], kept["target"]), "items": list(ranked)})
    return out


def _score(records: list[dict]) -> tuple[float, float]:
    from peft_grounded.evaluation.reports import user_value

    return tuple(sum(user_value(r, m) for r in records) / len(records) for m in ("recall@10", "ndcg@10"))


def fused_arms(
    llm: dict[str, dict[str, dict]],
    split,
    items: Sequence[str],
    seed: int,
    partner: int,
    args: Settings,
    sasrec=None,
) -> tuple[dict[str, dict[str, list[dict]]], dict[str, float]]:
    """``part -> arm -> per-user records`` of one seed on ``llm``'s users (``part -> user -> record``, each
    part in its order), and ``arm -> w`` of the products of experts (chosen on validation). ``partner``: the
    control SASRec's seed; ``sasrec``: the SASRec settings (None: the defaults, the behaviour SIDs' and the
    teacher's)."""
    from dataclasses import replace

    import torch

    from peft_grounded.evaluation import EvalSettings
    from peft_grounded.evaluation.reports import sampled_users
    from peft_grounded.sids.sasrec import SASRecConfig
    from peft_grounded.sids.sasrec_cache import shared_fit

    config = sasrec or SASRecConfig()
    column = {item: c for c, item in enumerate(items)}
    fits = {
        name: shared_fit(split, items, replace(config, seed=s))
        for name, s in (("sasrec", seed), ("sasrec2", partner))
    }
    out: dict[str, dict[str, list[dict]]] = {}
    candidates: dict[str, dict[str, dict[float, list[dict]]]] = {}
    for part, users in llm.items():
        examples, _, _ = sampled_users(split, part, EvalSettings(users=None, cold=False), set(), None)
        history = {user: list(h) for user, h, _ in examples}
        missing = [u for u in users if u not in history]
        if missing:
            raise SystemExit(
                f"users {missing[:3]} of the LLM's {part} records are not {part} users of the split"
            )
        histories = [history[u] for u in users]
        log_probs = {
            name: np.concatenate(
                [torch.log_softmax(s.double(), -1).numpy() for s in fit.score_batches(histories)]
            )
            for name, fit in fits.items()
        }
        lists = {name: [_top(row, items, args.depth) for row in lp] for name, lp in log_probs.items()}
        lists["llm"] = [r["items"][: args.depth] for r in users.values()]
        for first, second in (("llm", "sasrec"), ("sasrec", "sasrec2")):
            lists[f"{first}+{second}"] = [
                reciprocal_rank_fusion(pair, args.rrf_k, args.depth)
                for pair in zip(lists[first], lists[second], strict=True)
            ]
        firsts = {
            "llm*sasrec": (
                [dict(zip(r["items"], r["scores"], strict=True)) for r in users.values()],
                "sasrec",
            ),
            "sasrec*sasrec2": (
                [  # SASRec's own list (above) with its log-probabilities
                    {i: float(row[column[i]]) for i in ranked}
                    for ranked, row in zip(lists["sasrec"], log_probs["sasrec"], strict=True)
                ],
                "sasrec2",
            ),
        }
        candidates[part] = {
            arm: {
                w: _records(
                    users,
                    [
                        [i for i, _ in product_of_experts(f, s, items, w, args.depth)]
                        for f, s in zip(first, log_probs[second], strict=True)
                    ],
                )
                for w in args.weights
            }
            for arm, (first, second) in firsts.items()
        }
        out[part] = {arm: _records(users, lists[arm]) for arm in ARMS if arm in lists}
        drift = [r["user"] for r in out[part]["llm"] if r["rank"] != _rank10(users[r["user"]])]
        if drift:
            raise SystemExit(f"the LLM's {part} lists disagree with its recorded ranks for users {drift[:3]}")
    chosen = {
        arm: max(args.weights, key=lambda w: _score(candidates["valid"][arm][w]))
        for arm in candidates["valid"]
    }
    for part in out:
        for arm, w in chosen.items():
            out[part][arm] = candidates[part][arm][w]
    return out, chosen


def _top(log_probs: np.ndarray, items: Sequence[str], depth: int) -> list[str]:
    """The ``depth`` items of highest log-probability, best first, the excluded (-inf) left out."""
    return [items[c] for c in np.argsort(-log_probs, kind="stable")[:depth] if log_probs[c] > -math.inf]


def overlap(first: list[dict], second: list[dict]) -> dict[str, float]:
    """Shares of users whose target is in the top 10 of both arms, of the first only, of the second only, and
    of either (an oracle that picks the right list per user, not a rule)."""
    hits = [(_rank10(a) is not None, _rank10(b) is not None) for a, b in zip(first, second, strict=True)]
    n = len(hits)
    return {
        "both": sum(a and b for a, b in hits) / n,
        "first only": sum(a and not b for a, b in hits) / n,
        "second only": sum(b and not a for a, b in hits) / n,
        "either": sum(a or b for a, b in hits) / n,
    }


def _rank10(record: dict) -> int | None:
    rank = record.get("rank")
    return rank if rank is not None and rank < 10 else None


def main(argv=None) -> None:
    from peft_grounded.sids import SIDIndex, load_catalogue

    args = parse_args(argv)
    out = Path(args.out)
    split = load_catalogue(args.dataset).leave_one_out()
    for valid, test, sids, seed, partner in zip(
        args.valid, args.test, args.sids, args.seeds, args.partners, strict=True
    ):
        items = list(SIDIndex.load(sids).item_ids)
        llm = {"valid": llm_records(Path(valid), "valid"), "test": llm_records(Path(test), "test")}
        arms, chosen = fused_arms(llm, split, items, seed, partner, args)
        print(f"seed {seed}: the products' weights chosen on validation: {chosen}")
        shares = overlap(arms["test"]["llm"], arms["test"]["sasrec"])
        print(
            f"seed {seed}: test users hit in the top 10 by the LLM and SASRec: "
            + ", ".join(f"{name} {share:.3f}" for name, share in shares.items())
        )
        for part, by_arm in arms.items():
            for arm, records in by_arm.items():
                write_json_atomic(out / part / f"{arm}-s{seed}" / "users.json", {part: records})
    for part in PARTS:
        pool_arms.main(
            ["--part", part, "--subset", args.subset]
            + [f"{arm}=" + ",".join(str(out / part / f"{arm}-s{s}") for s in args.seeds) for arm in ARMS]
        )


if __name__ == "__main__":
    main()
