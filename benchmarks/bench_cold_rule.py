"""Cold items served by the new-item rule: the semantic mixture with the catalogue's cold items as its items.

    python benchmarks/bench_cold_rule.py --dataset ../shared/data/amazon-office \
      --runs runs/i40/office48-s0 runs/i40/office48-s1

A model trained on the interactions ranks an item it saw once or never (a *cold* item) no better than a new
one: beam search follows the transitions it learnt. The rule ``peft-grounded`` serves new items with
(:class:`~peft_grounded.new_items.NewItemRule`, ``share`` mode) needs only a set of items the model cannot
rank and the items' text vectors; here the set is every catalogue item seen at most ``--max-count`` times as
a training target (read from the training split alone). The rule is fitted, as for new items, on the
interactions logged since training: each user's validation pair. No test target is read before scoring.

Each run is a demo folder (``bench_demo_recipe.py --eval-parts test``): its SID index, its catalogue and the
LLM's per-user test lists (top 20, the history left out) in ``strategies/<name>-seed<N>/metrics.json``. No
model is decoded here: the rule mixes the lists the run already decoded. Rows, on the run's cold-target
users, its warm-target users (the sample of all users whose target is not cold) and all sampled users:

- the LLM alone;
- **the LLM + cold rule** (the served rule: the LLM's list keeps its first ``k - round(k * pi_u)`` places,
  the rest go to the cold items of highest ``p_text``); the same with one place always the cold items'
  (``min_places=1``), and with the index's own vectors in place of the text (for a behaviour index, the
  text-mapped behaviour vectors: the control of ``rule_vectors``); the ``probability`` mode;
- the same rule over text KNN beams (the text-only mixture, a control);
- the cold items by ``p_text`` alone (a control);
- text KNN, last item and recency profile (the peers of "Cold items (Office)").

Intervals: paired percentile bootstrap over users, pooled over the runs (users resampled within each run).
Writes ``<out>/cold_rule.json`` and prints the tables. ``--save-rule ADAPTER`` stores the first run's rule
(``--min-places`` reserved) in an adapter folder: ``peft-grounded evaluate`` and ``recommend`` then serve
it, which checks the offline mixing against the served route.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from peft_grounded.decoding import Recommendations
from peft_grounded.evaluation.metrics import metric_value, target_rank
from peft_grounded.evaluation.peers import TextKNN
from peft_grounded.intervals import bootstrap_interval
from peft_grounded.new_items import NewItemRule, index_vectors, rule_vectors
from peft_grounded.sids import SIDIndex, load_catalogue

try:
    from benchmarks._args import parse
    from benchmarks.new_item_protocol import P_TEXT, TEXT_ONLY, control_lists
except ModuleNotFoundError:  # run as a file: its folder is on sys.path, not the repository
    from _args import parse
    from new_item_protocol import P_TEXT, TEXT_ONLY, control_lists

LLM, SERVED = "LLM alone", "LLM + cold rule (share)"
RESERVED, BY_PROBABILITY = "LLM + cold rule (share, 1 place reserved)", "LLM + cold rule (probability)"
RESERVED_OWN = "... 1 place reserved, the index's own vectors"  # a behaviour index: its text-mapped vectors
KNN_LAST, KNN_RECENCY = "text KNN (last item)", "text KNN (recency)"
ROWS = (LLM, SERVED, RESERVED, RESERVED_OWN, BY_PROBABILITY, TEXT_ONLY, P_TEXT, KNN_LAST, KNN_RECENCY)
GROUPS = ("cold", "warm", "all")
PAIRS = (
    (SERVED, KNN_LAST),
    (SERVED, LLM),
    (RESERVED, KNN_LAST),
    (RESERVED, KNN_RECENCY),
    (RESERVED, LLM),
    (SERVED, TEXT_ONLY),
    (P_TEXT, KNN_LAST),
)


@dataclass
class Arguments:
    runs: list[str] = field(metadata={"help": "demo folders, one per seed (their SIDs and test lists)"})
    dataset: str = field(
        default="movielens-100k", metadata={"help": "the catalogue the runs trained on (load_catalogue)"}
    )
    max_count: int = field(
        default=1, metadata={"help": "an item is cold when it was a training target at most this often"}
    )
    k: int = field(default=10, metadata={"help": "list length scored"})
    rounds: int = field(default=10000, metadata={"help": "bootstrap resamples"})
    save_rule: str | None = field(
        default=None,
        metadata={
            "help": "an adapter folder of the first run (a copy): the first run's cold rule is saved there "
            "(new_item_rule.json), so that evaluate and recommend serve it"
        },
    )
    min_places: int = field(default=1, metadata={"help": "--save-rule: places reserved for the cold items"})
    out: str | None = field(
        default=None, metadata={"help": "folder for cold_rule.json (default: the first run)"}
    )


def run_lists(run: Path) -> tuple[str, list[dict]]:
    """The strategy folder's name and the LLM's per-user test records of the one strategy a run holds."""
    found = sorted((run / "strategies").glob("*/metrics.json"))
    if len(found) != 1:
        raise SystemExit(f"{run}: expected one strategies/*/metrics.json, found {len(found)}")
    records = json.loads(found[0].read_text())["users"].get("test")
    if not records or "items" not in records[0]:
        raise SystemExit(f"{found[0]} holds no per-user test lists: run the demo with --eval-parts test")
    return found[0].parent.name, records


def score_run(run: Path, catalogue, vectors: np.ndarray, args: Arguments) -> dict:
    """Per-user recall/ndcg of every row for one run, and what the rule was fitted on."""
    index = SIDIndex.load(run / "sids")
    item_ids = [str(i) for i in index.item_ids]
    split = catalogue.leave_one_out()
    counts = split.training_target_counts()
    cold = [i for i in item_ids if counts.get(i, 0) <= args.max_count]
    users = {u.user_id: u for u in split.users}
    logged = [
        [*u.history, u.valid] for u in split.users
    ]  # each user's validation pair: logged since training
    rule = NewItemRule.fit(index, logged, new_items=cold, vectors=vectors)  # the new-item rule as shipped
    mixture = rule.mixture
    name, records = run_lists(run)
    histories = [[*users[r["user"]].history, users[r["user"]].valid] for r in records]
    targets = [r["target"] for r in records]
    width = max(len(r["items"]) for r in records)
    beams = Recommendations(
        items=[list(r["items"]) for r in records],
        scores=[list(r["scores"]) for r in records],
        k=width,
        num_beams=width,
    )
    lists = {LLM: [list(r["items"]) for r in records], SERVED: rule.apply(beams, histories, args.k).items}
    lists[RESERVED] = NewItemRule(mixture, "", "share", min_places=1).apply(beams, histories, args.k).items
    lists[BY_PROBABILITY] = NewItemRule(mixture, "", "probability").apply(beams, histories, args.k).items
    own = NewItemRule.fit(index, logged, new_items=cold, vectors=index_vectors(index), min_places=1)
    lists[RESERVED_OWN] = own.apply(beams, histories, args.k).items
    lists |= control_lists(mixture, histories, args.k, width, "share")
    for profile in ("last", "recency"):
        knn = TextKNN(item_ids, vectors, profile=profile)
        lists[knn.name] = knn.recommend(histories, args.k)
    cold_set = set(cold)
    member = {
        "cold": np.array([bool(r["cold"]) for r in records]),
        "warm": np.array(
            [bool(r["all"]) and t not in cold_set for r, t in zip(records, targets, strict=True)]
        ),
        "all": np.array([bool(r["all"]) for r in records]),
    }
    per_user = {
        row: {
            metric: np.array(
                [
                    metric_value(target_rank(lst[: args.k], t), f"{metric}@{args.k}")
                    for lst, t in zip(ls, targets, strict=True)
                ]
            )
            for metric in ("recall", "ndcg")
        }
        for row, ls in lists.items()
    }
    if args.save_rule and run == Path(args.runs[0]):
        saved = NewItemRule(mixture, index.fingerprint(), "share", rule.fitted_on, min_places=args.min_places)
        saved.save(args.save_rule)
    return {
        "run": str(run),
        "strategy": name,
        "cold_items": len(cold),
        "fitted_on": rule.fitted_on,
        "temperature": float(mixture.temperature),
        "weights": [float(w) for w in mixture.weights],
        "users": {g: int(m.sum()) for g, m in member.items()},
        "member": member,
        "per_user": per_user,
    }


def interval(groups: list[np.ndarray], rounds: int) -> str:
    found = bootstrap_interval(groups, resamples=rounds, seed=0)
    return f"{found['difference']:+.3f} [{found['low']:+.3f}, {found['high']:+.3f}]"


def main(argv=None) -> dict:
    args = parse(Arguments, argv, prog="bench_cold_rule.py", description=__doc__)
    runs = [Path(r) for r in args.runs]
    catalogue = load_catalogue(args.dataset)
    first = SIDIndex.load(runs[0] / "sids")
    vectors = rule_vectors(first, catalogue)  # the items' text, as the served rule encodes it
    scored = [score_run(run, catalogue, vectors, args) for run in runs]
    result: dict = {"runs": [{k: v for k, v in s.items() if k not in ("member", "per_user")} for s in scored]}
    lines = []
    for metric in ("recall", "ndcg"):
        lines += [
            f"| row | {' | '.join(f'{g} users, {metric}@{args.k}' for g in GROUPS)} |",
            "|---|---|---|---|",
        ]
        for row in ROWS:
            cells = []
            for g in GROUPS:
                groups = [s["per_user"][row][metric][s["member"][g]] for s in scored]
                found = bootstrap_interval(groups, resamples=args.rounds, seed=0)
                cells.append(f"{found['difference']:.3f} [{found['low']:.3f}, {found['high']:.3f}]")
                result.setdefault("means", {}).setdefault(row, {})[f"{g}_{metric}"] = [
                    float(found[key]) for key in ("difference", "low", "high")
                ]
            lines.append(f"| {row} | {' | '.join(cells)} |")
        lines.append("")
        lines += [
            f"| paired, {metric}@{args.k} | {' | '.join(f'{g} users' for g in GROUPS)} |",
            "|---|---|---|---|",
        ]
        for a, b in PAIRS:
            cells = [
                interval(
                    [
                        s["per_user"][a][metric][s["member"][g]] - s["per_user"][b][metric][s["member"][g]]
                        for s in scored
                    ],
                    args.rounds,
                )
                for g in GROUPS
            ]
            result.setdefault("paired", {})[f"{a} - {b} ({metric})"] = dict(zip(GROUPS, cells, strict=True))
            lines.append(f"| {a} - {b} | {' | '.join(cells)} |")
        lines.append("")
    users = {g: sum(s["users"][g] for s in scored) for g in GROUPS}
    header = (
        f"Cold items: trained at most {args.max_count}x ({scored[0]['cold_items']} of {len(first.item_ids)} items); "
        f"{len(runs)} run(s), users {users}; rule fitted on {scored[0]['fitted_on']}"
    )
    print(header, *lines, sep="\n")
    result["table"] = [header, *lines]
    out = Path(args.out) if args.out else runs[0]
    (out / "cold_rule.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
