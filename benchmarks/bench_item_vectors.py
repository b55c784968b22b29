"""SIDs from text, from behaviour and from the mix (issue 40, item 1): what each puts into the codes.

For one catalogue, the demo preset's SIDs (3 levels of 64 codes, its text fields) are built from each
source of item vectors, and each index is described by its collisions, its level use and, for behaviour,
the text-to-behaviour map's held-out R^2. Then the same no-model rule scores each index on validation:
recommend the items whose SID shares the longest prefix with the last history item's, ties by training
popularity, history left out. It measures how much of what users do next the codes hold, without the LLM;
popularity alone (every prefix shared length 0) is its control. Paired per user against the text index.

    python benchmarks/bench_item_vectors.py --dataset movielens-100k
    python benchmarks/bench_item_vectors.py --dataset ../shared/data/amazon-office

The index's settings are parsed from the package's declarations under their flags: ``ItemVectorsConfig``
(the behaviour and mix sources' settings) and, of ``build-sids``' ``BuildSIDsArguments``, ``--levels``,
``--codes`` and ``--seed``, the demo preset's levels and codes their defaults.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field, replace

import numpy as np

from peft_grounded.cli.recommend import RecommendArguments
from peft_grounded.cli.sids import BuildSIDsArguments
from peft_grounded.intervals import bootstrap_interval
from peft_grounded.pipeline.demo import PRESETS
from peft_grounded.sids.behaviour import ItemVectorsConfig

try:
    from benchmarks._args import package_fields, parse
except ModuleNotFoundError:  # run as a file: its folder is on sys.path, not the repository
    from _args import package_fields, parse


@dataclass
class BenchArguments:
    """The catalogue and the sources compared; the index's settings (:data:`SIDFields`, ``ItemVectorsConfig``) and
    the rule's list length (``recommend``'s ``k``) are the package's, parsed beside."""

    dataset: str = field(default="movielens-100k", metadata={"help": "A catalogue load_catalogue reads."})
    sources: str = field(
        default="text,behaviour,mix", metadata={"help": "Comma-separated item-vector sources."}
    )


# the fields of build-sids' settings set here, as the package declares them; the demo preset's SIDs by default
SIDFields = package_fields(BuildSIDsArguments, "levels", "codes", "seed")
ListFields = package_fields(RecommendArguments, "k")  # the prefix rule's list length, as recommend's lists
DEFAULTS = {"levels": PRESETS["default"].levels, "codes": str(PRESETS["default"].codes)}


def parse_args(argv=None) -> tuple:
    """The settings and the package's parsed beside them: ``args, sids, vector_args`` (the list length set on
    ``args.k``)."""
    args, sids, vector_args, lists = parse(
        (BenchArguments, SIDFields, ItemVectorsConfig, ListFields),
        argv,
        prog="bench_item_vectors.py",
        description=__doc__,
        check=lambda args, sids, vector_args, lists: (
            f"{args} (k {lists.k})\n{sids} (codes per level: {BuildSIDsArguments.code_counts(sids)})\n"
            f"{vector_args}"
        ),
        defaults=DEFAULTS,
    )
    args.k = lists.k
    return args, sids, vector_args


def prefix_rule_hits(index, split, k: int, use_codes: bool = True) -> dict[str, float]:
    """Per validation user: 1 if the target is among the ``k`` items sharing the longest SID prefix with the
    last history item (ties by training popularity; history left out), else 0."""
    popularity = Counter(i for user in split.users for i in user.history)
    order = sorted(index.item_ids, key=lambda i: -popularity.get(i, 0))
    rank = {item: r for r, item in enumerate(order)}
    codes = {item: tuple(index.codes[index.row_of(item)]) for item in index.item_ids}
    hits = {}
    for user in split.users:
        seen = set(user.history)
        last = codes[user.history[-1]] if use_codes else ()

        def shared(item, last=last):
            n = 0
            for a, b in zip(codes[item], last, strict=False):
                if a != b:
                    break
                n += 1
            return n

        candidates = [i for i in order if i not in seen]
        top = sorted(candidates, key=lambda i: (-shared(i), rank[i]))[:k]
        hits[user.user_id] = float(user.valid in top)
    return hits


def main(argv=None) -> None:
    from peft_grounded.sids import build_sids, load_catalogue

    args, sids, vector_args = parse_args(argv)
    catalogue = load_catalogue(args.dataset)
    split = catalogue.leave_one_out()
    fields = list(PRESETS["default"].text_fields)
    rows, hits = [], {}
    for source in [s.strip() for s in args.sources.split(",") if s.strip()]:
        start = time.perf_counter()
        index = build_sids(
            catalogue,
            levels=sids.levels,
            codes=BuildSIDsArguments.code_counts(sids),  # the package's reading of --codes
            text_template=fields,
            seed=sids.seed,
            item_vectors=replace(vector_args, item_vectors=source),
            show_progress=False,
        )
        seconds = time.perf_counter() - start
        before = index.quality["collisions_before"]
        hits[source] = prefix_rule_hits(index, split, args.k)
        used = len(np.unique(index.codes[:, 0]))
        rows.append(
            (
                source,
                index.dim,
                before["colliding_items"],
                before["max_items_per_sid"],
                used,
                index.quality.get("behaviour_map_r2", ""),
                index.quality.get("behaviour_warm_items", ""),
                seconds,
            )
        )
    popularity = prefix_rule_hits(index, split, args.k, use_codes=False)
    print(
        f"catalogue {catalogue.name}: {len(catalogue)} items, {len(split.users)} validation users, seed {sids.seed}"
    )
    print(
        "| vectors | dim | colliding items before dedup | max items per SID | level-1 codes used | map R^2 (held out) "
        "| warm items | build s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print("| " + " | ".join(str(x if not isinstance(x, float) else round(x, 3)) for x in row) + " |")
    users = sorted(popularity)
    print(f"\nPrefix rule, validation Recall@{args.k} (history left out), paired per user against text:")
    print("| rule | Recall | minus text [95% CI] | minus popularity [95% CI] |")
    print("|---|---:|---:|---:|")
    pop = np.array([popularity[u] for u in users])
    print(f"| popularity | {pop.mean():.4f} | | |")
    text = np.array([hits["text"][u] for u in users]) if "text" in hits else None
    for source, scored in hits.items():
        values = np.array([scored[u] for u in users])
        cells = []
        for reference in (text, pop):
            if reference is None or reference is values:
                cells.append("")
                continue
            ci = bootstrap_interval([values - reference], seed=sids.seed)
            cells.append(f"{ci['difference']:+.4f} [{ci['low']:+.4f}, {ci['high']:+.4f}]")
        print(f"| prefix of {source} SIDs | {values.mean():.4f} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
