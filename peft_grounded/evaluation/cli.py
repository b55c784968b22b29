"""``peft-grounded evaluate``: Recall/NDCG@K of a trained adapter by constrained beam search."""

from __future__ import annotations

from typing import Any

from ..cli_common import add_data_args


def add_cli(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "evaluate",
        help="decode the top-K items of valid/test users with the SID-constrained beam search and score them",
        description="Recall@K and NDCG@K (K = 1, 5, 10, 20) on all users and on cold-item targets, for the "
        "validation and test targets of the leave-one-out split. Writes JSON and a markdown table.",
    )
    add_data_args(p)
    p.add_argument(
        "--adapter", required=True, help="trained adapter directory (e.g. OUTPUT/adapter of `sft`)"
    )
    p.add_argument("--out", required=True, help="directory for metrics.json and metrics.md")
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
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def run(args) -> int:
    from pathlib import Path

    from peft import PeftModel

    from ..adapter import add_tokens
    from ..cli_common import load_data, model_path, prompt_format
    from ..recommend.runner import Budget, Experiment, evaluate_users, item_token_ids, load_base
    from . import markdown_table, write_json, write_markdown

    catalogue, index = load_data(args)
    tokenizer, base = load_base(model_path(args))
    add_tokens(tokenizer, base, index.token_strings)
    model = PeftModel.from_pretrained(base, args.adapter)
    experiment = Experiment(model_path(args), catalogue, index, fmt=prompt_format(args))
    budget = Budget(
        num_beams=args.num_beams,
        eval_batch_size=args.batch_size,
        cold_max_count=args.cold_max_count,
        ks=tuple(args.ks),
    )
    results = evaluate_users(
        model,
        tokenizer,
        experiment,
        item_token_ids(tokenizer, index),
        budget,
        tuple(args.splits),
        budget.ks,
        args.users,
        args.seed,
    )
    out = Path(args.out)
    write_json(out / "metrics.json", results)
    write_markdown(out / "metrics.md", results, title=f"Evaluation of {args.adapter}")
    print(markdown_table(results, title=f"Evaluation of {args.adapter}"))
    return 0
