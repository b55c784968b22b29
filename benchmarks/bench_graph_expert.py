"""Does the transition graph (TGH) add to SASRec's lists? SASRec fused with TGH, no LLM: the third expert's control.

    OMP_NUM_THREADS=1 python benchmarks/bench_graph_expert.py --sid_index runs/tgh-ml100k/sids \
        --catalogue movielens-100k --out runs/graph-expert-ml100k.json
    OMP_NUM_THREADS=1 python benchmarks/bench_graph_expert.py --sid_index runs/tgh-office/sids \
        --catalogue ../shared/data/amazon-office --out runs/graph-expert-office.json

``--sid_index`` and ``--catalogue`` are the package's (``DataArguments``): the catalogue defaults to the one
the index records, and one given is checked against it.

Arms, every validation and test user of the leave-one-out split, the history left out of every list:

- ``sasrec``: SASRec at its best validation epoch (``sids.sasrec_cache.shared_fit``, the fit the behaviour SIDs,
  the distillation teacher and ``fuse-peer``'s peer read);
- ``tgh``: the transition-graph heuristic (:mod:`peft_grounded.evaluation.graph_peer`), its settings chosen on
  validation (``choose_settings``);
- ``sasrec*tgh w``: the product of experts ``log p_SASRec(i) + w log p_TGH(i)`` over every item, one row per
  ``--graph_weights`` value.

The weight served is chosen as ``fuse-peer`` chooses: none (SASRec alone) unless the best weight on the
validation users beats it with a paired 95% bootstrap interval of Recall@10 above 0. The test rows give each
weight's paired difference against SASRec alone. A graph that joins the served fusion as a third expert must
first add to SASRec's own lists here.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from peft_grounded.cli.common import DataArguments

try:
    from benchmarks._args import package_fields, parse
except ModuleNotFoundError:  # run as a file: its folder is on sys.path, not the repository
    from _args import package_fields, parse

PARTS = ("valid", "test")


IndexFields = package_fields(DataArguments, "sid_index", "catalogue")


@dataclass
class Settings:
    out: str = field(default="", metadata={"help": "a JSON file for the tables (none: printed only)"})
    graph_weights: list[float] = field(
        default_factory=lambda: [0.1, 0.25, 0.5, 1.0, 2.0],
        metadata={"help": "the graph's weights w in log p_SASRec + w log p_TGH"},
    )

    def __post_init__(self) -> None:
        if not self.graph_weights or any(not (w > 0 and math.isfinite(w)) for w in self.graph_weights):
            raise SystemExit(f"--graph_weights are positive numbers, got {self.graph_weights}")


def fused_hits(
    sasrec: np.ndarray, graph: np.ndarray, targets: np.ndarray, weight: float, k: int = 10
) -> np.ndarray:
    """Per user, whether the target is among the ``k`` best of ``sasrec + weight * graph`` (log-probabilities
    ``[users, items]``, the history at -inf in both; a tie counts against the target)."""
    fused = sasrec + weight * graph if weight else sasrec
    at = fused[np.arange(len(targets)), targets]
    return np.isfinite(at) & ((fused >= at[:, None]).sum(1) <= k)


def parse_args(argv=None) -> tuple[Settings, IndexFields]:
    """The script's settings and the package's ``--sid_index`` / ``--catalogue``."""
    return parse((Settings, IndexFields), argv, prog="bench_graph_expert.py", description=__doc__)


def graph_expert(index, catalogue, graph_weights) -> dict:
    """The tables: per part, one row per arm (Recall@10 and, but for SASRec, the paired interval against it),
    the TGH settings chosen on validation and the weight fuse-peer's rule would serve (0: SASRec alone)."""
    from peft_grounded.evaluation.graph_peer import TransitionGraphPeer, choose_settings
    from peft_grounded.evaluation.metrics import EvalSettings
    from peft_grounded.evaluation.reports import sampled_users
    from peft_grounded.intervals import bootstrap_interval
    from peft_grounded.serving.peer_fusion import peer_log_probs
    from peft_grounded.sids.sasrec import SASRecConfig
    from peft_grounded.sids.sasrec_cache import shared_fit

    split = catalogue.leave_one_out()
    items = list(index.item_ids)
    column = {item: c for c, item in enumerate(items)}
    sasrec = shared_fit(split, items, SASRecConfig())
    graph = TransitionGraphPeer.from_index(index, catalogue, split)
    chosen, _ = choose_settings(graph, split)
    graph = graph.with_settings(chosen)
    weights = [0.0, *sorted(set(graph_weights))]
    tables, users = {}, {}
    for part in PARTS:
        examples, _, _ = sampled_users(split, part, EvalSettings(), set(), None)
        histories = [list(h) for _, h, _ in examples]
        targets = np.array([column[t] for *_, t in examples])
        log_sasrec, log_graph = peer_log_probs(sasrec, histories), graph.log_probs(histories)
        hits = {w: fused_hits(log_sasrec, log_graph, targets, w) for w in weights}
        hits[-1.0] = fused_hits(log_graph, log_graph, targets, 0.0)  # TGH alone
        rows = []
        for w in [-1.0, *weights]:
            row = {"arm": "tgh" if w < 0 else ("sasrec" if w == 0 else f"sasrec*tgh {w:g}"), "weight": w}
            row["recall@10"] = float(hits[w].mean())
            if w != 0:
                row["minus_sasrec"] = bootstrap_interval([hits[w].astype(float) - hits[0.0]])
            rows.append(row)
        tables[part], users[part] = rows, len(targets)
    best = max((r for r in tables["valid"] if r["weight"] > 0), key=lambda r: r["recall@10"])
    served = best["weight"] if best["minus_sasrec"]["low"] > 0 else 0.0
    return {"tgh": asdict(chosen), "users": users, "tables": tables, "served_weight": served}


def main(argv=None) -> dict:
    from peft_grounded.sids import SIDIndex
    from peft_grounded.sids.catalogue_source import index_catalogue
    from peft_grounded.training.runs import write_json_atomic

    args, data = parse_args(argv)
    index = SIDIndex.load(data.sid_index)
    catalogue = index_catalogue(index, data.catalogue)
    result = graph_expert(index, catalogue, args.graph_weights)
    print(f"{catalogue.name}: TGH settings {result['tgh']}; users {result['users']}")
    print("| arm | valid R@10 | valid - SASRec | test R@10 | test - SASRec |")
    print("|---|---:|---|---:|---|")
    for v, t in zip(result["tables"]["valid"], result["tables"]["test"], strict=True):
        spans = [
            (f"{r['minus_sasrec']['difference']:+.4f} [{r['minus_sasrec']['low']:+.4f}, "
             f"{r['minus_sasrec']['high']:+.4f}]") if "minus_sasrec" in r else "—"
            for r in (v, t)
        ]  # fmt: skip
        print(f"| {v['arm']} | {v['recall@10']:.4f} | {spans[0]} | {t['recall@10']:.4f} | {spans[1]} |")
    served = result["served_weight"]
    print(f"served (fuse-peer's rule on validation): {'SASRec alone' if not served else f'w = {served:g}'}")
    result |= {"settings": asdict(args) | asdict(data), "catalogue": catalogue.name}
    if args.out:
        write_json_atomic(args.out, result)
    return result


if __name__ == "__main__":
    main()
