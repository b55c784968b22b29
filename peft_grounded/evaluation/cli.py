"""``peft-grounded evaluate``: Recall/NDCG@K of a trained adapter by constrained beam search
(:func:`~.evaluator.evaluate_adapter`)."""

from __future__ import annotations

from typing import Any

from ..cli_common import add_data_args


def add_cli(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "evaluate",
        help="decode the top-K items of valid/test users with the SID-constrained beam search and score them",
        description="Recall@K and NDCG@K on a seeded sample of users and on users whose target is a cold item, "
        "for the validation and test targets of the leave-one-out split. Uses the prompt format recorded in "
        "the adapter. Writes metrics.json and metrics.md, the targets' log-likelihood (likelihood.json) and one record per user (users.json: target, rank, NLLs).",
    )
    add_data_args(p)
    p.add_argument(
        "--adapter", required=True, help="trained adapter directory (e.g. OUTPUT/adapter of `sft`)"
    )
    p.add_argument("--output", "--out", dest="output", required=True, help="directory for metrics.json/.md")
    p.add_argument("--splits", nargs="+", default=["valid", "test"], choices=["valid", "test"])
    p.add_argument("--users", type=int, default=None, help="evaluate a seeded sample of this many users")
    p.add_argument(
        "--ks", nargs="+", type=int, default=[1, 5, 10, 20], help="cut-offs K of Recall@K / NDCG@K"
    )
    p.add_argument("--num-beams", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument(
        "--cold-max-count", type=int, default=1, help="cold: target seen at most this often in training"
    )
    p.add_argument("--bf16", action="store_true", help="bf16 base and decoding")
    p.add_argument(
        "--new-item-share",
        type=float,
        default=None,
        help="for a grown index (add-items): give up to this share of each top-K to the items it added that "
        "share a generated item's SID prefix (TIGER's cold-start rule); default: off",
    )
    p.add_argument(
        "--match-levels",
        type=int,
        default=None,
        help="prefix codes for --new-item-share (default: all but the last)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..cli_common import load_data
    from . import markdown_table
    from .evaluator import evaluate_adapter_into
    from .users import EvalSettings

    settings = EvalSettings(
        ks=tuple(args.ks),
        users=args.users,
        seed=args.seed,
        num_beams=args.num_beams,
        batch_size=args.batch_size,
        cold_max_count=args.cold_max_count,
        bf16=args.bf16,
        new_item_share=args.new_item_share,
        match_levels=args.match_levels,
    )  # checked before anything loads
    catalogue, index = load_data(args)
    evaluation = evaluate_adapter_into(
        args.output,
        args.adapter,
        index,
        catalogue,
        settings,
        model_path=args.model,
        parts=tuple(args.splits),
    )
    print(markdown_table(evaluation.metrics, title=f"Evaluation of {args.adapter}"))
    return 0
