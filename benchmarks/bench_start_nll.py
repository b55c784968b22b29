"""How far from uniform each start puts the SID tokens before any training: held-out constrained NLL at step 0.

    python benchmarks/bench_start_nll.py --demo-dir runs/demo-B --blocks 8 --scales 1 0.5 0.25 0.1

Reads a demo folder (``peft-grounded demo`` or ``benchmarks/bench_demo_recipe.py``: its ``sids/`` and, with
``--blocks N``, its ``base-N-blocks/``), starts the SID rows with each strategy, and for the centroid start
also pulled toward the vocabulary mean by ``--scales`` (``GroundedTokenConfig.init_scale``; 1 is the
norm-matched start; the centroid rows' own mean is the vocabulary mean, so this is a shrink around it), then scores the validation users' next items under the SID trie (the constrained NLL that
beam search ranks by; uniform: every SID equally likely). Issue 28, item 4: why centroid starts high.
``--seed`` is the run's (``RecommendationConfig``'s: the rows' initialisation), the user sample's seed + 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

try:
    from benchmarks._args import package_fields, parse
except ModuleNotFoundError:  # run as a file: its folder is on sys.path, not the repository
    from _args import package_fields, parse

from peft_grounded.training.stage_config import RecommendationConfig


@dataclass
class Settings:
    demo_dir: Path = field(metadata={"help": "a demo output folder (sids/, base-N-blocks/)"})
    blocks: int = field(default=0, metadata={"help": "the demo's --layers (0: the whole SmolLM2)"})
    starts: list[str] = field(
        default_factory=lambda: ["mean", "centroid", "gaussian"], metadata={"help": "the starts scored"}
    )
    scales: list[float] = field(
        default_factory=lambda: [1.0, 0.5, 0.25, 0.1],
        metadata={"help": "init_scale values of the centroid start, fractions in (0, 1]"},
    )
    users: int = field(default=200, metadata={"help": "validation users scored"})


# the run's seed (the rows' start; the user sample's is seed + 1), as the package declares it
SeedFields = package_fields(RecommendationConfig, "seed")


def parse_args(argv=None) -> Settings:
    """The settings, the package's seed set on them (``args.seed``)."""
    args, seeds = parse(
        (Settings, SeedFields), argv, prog="bench_start_nll.py", description=__doc__, check=check
    )
    args.seed = seeds.seed
    return args


def check(args: Settings, seeds=None) -> dict:
    if any(not 0 < s <= 1 for s in args.scales):
        raise SystemExit(f"--scales are fractions in (0, 1], got {args.scales}")
    found = {"sids": args.demo_dir / "sids", "base": base_of(args)}
    return found if seeds is None else {**found, "seed": seeds.seed}


def base_of(args: Settings) -> str:
    if args.blocks:
        return str(args.demo_dir / f"base-{args.blocks}-blocks")
    from peft_grounded import assets

    return str(assets.smollm2())


def main(argv=None) -> None:
    import torch

    from peft_grounded.decoding import SIDTrie
    from peft_grounded.decoding.trie import item_token_ids
    from peft_grounded.evaluation.metrics import EvalSettings
    from peft_grounded.pipeline.budget import Experiment
    from peft_grounded.pipeline.demo import PRESETS
    from peft_grounded.pipeline.runner import _evaluate
    from peft_grounded.sids import SIDIndex, load_catalogue
    from peft_grounded.sids.extended_base import RowStart, sid_model

    args = parse_args(argv)
    base, index = base_of(args), SIDIndex.load(args.demo_dir / "sids")
    fmt = PRESETS["default"].prompt_format()
    experiment = Experiment(base, load_catalogue("movielens-100k"), index, fmt=fmt)
    settings = EvalSettings(users=args.users, seed=args.seed + 1, ks=(10,), cold=False)
    runs = [(start, 1.0) for start in args.starts]
    runs += [("centroid", s) for s in args.scales if s != 1.0 and "centroid" in args.starts]
    print("| start | init_scale | constrained NLL | uniform | mean row norm |")
    print("|---|---:|---:|---:|---:|")
    for start, scale in runs:
        torch.manual_seed(args.seed)
        tokenizer, model = sid_model(
            base, index, start=RowStart(init=start, init_scale=scale), fmt=fmt, seed=args.seed
        )
        rows = model.get_input_embeddings().grounded_embedding["default"]
        norm = float(rows.detach().norm(dim=1).mean())
        trie = SIDTrie(item_token_ids(tokenizer, index))
        found = _evaluate(
            model, tokenizer, experiment, ("valid",), settings, trie, ranking=False, likelihood=True
        )
        nll = found.likelihood["valid"]["all"]
        print(
            f"| {start} | {scale:g} | {nll['constrained_nll']:.2f} | {nll['uniform_nll']:.2f} | {norm:.3f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
