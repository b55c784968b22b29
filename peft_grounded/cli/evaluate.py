"""``peft-grounded evaluate``: Recall/NDCG@K of a trained adapter by constrained beam search
(:func:`peft_grounded.evaluation.evaluate_adapter`).

The flags are the fields of :class:`EvaluateArguments` and :class:`~peft_grounded.evaluation.EvalSettings`, parsed
by TRL's parser; ``--config evaluate.yaml`` gives any of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .common import Command

if TYPE_CHECKING:
    from ..evaluation.metrics import EvalSettings

DESCRIPTION = (
    "Recall@K and NDCG@K on a seeded sample of users and on users whose target is a cold item, for the validation "
    "and test targets of the leave-one-out split. Uses the prompt format recorded in the adapter. Writes "
    "metrics.json and metrics.md, the targets' log-likelihood (likelihood.json) and one record per user "
    "(users.json: target, rank, NLLs). Every flag is a field of EvaluateArguments or EvalSettings; "
    "--config FILE.yaml sets any of them."
)
PARTS = ("valid", "test")


@dataclass
class EvaluateArguments:
    """The adapter to evaluate, its data, and where the results go."""

    adapter: str = field(metadata={"help": "Trained adapter directory (e.g. OUTPUT_DIR/adapter of `sft`)."})
    sid_index: str = field(metadata={"help": "SID index directory the adapter was trained with."})
    output_dir: str = field(metadata={"help": "Directory for metrics.json/.md, likelihood.json, users.json."})
    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Local base model directory; None: the base recorded in the adapter."},
    )
    catalogue: str = field(
        default="movielens-100k",
        metadata={"help": "Catalogue path or 'movielens-100k' (the one the SID index was built from)."},
    )
    splits: list[str] = field(
        default_factory=lambda: list(PARTS), metadata={"help": "Parts of the split to evaluate: valid, test."}
    )

    def __post_init__(self) -> None:
        unknown = [s for s in self.splits if s not in PARTS]
        if unknown or not self.splits:
            raise ValueError(f"splits={self.splits!r}: name valid and/or test.")


def settings() -> tuple[type, ...]:
    from ..evaluation.metrics import EvalSettings

    return (EvaluateArguments, EvalSettings)


def run(args: EvaluateArguments, settings: EvalSettings) -> int:
    """Evaluate as the settings say and write the result files (locked, checked before decoding)."""
    from ..evaluation import markdown_table
    from ..evaluation.evaluator import evaluate_adapter_into
    from .common import load_data

    catalogue, index = load_data(args.catalogue, args.sid_index)
    evaluation = evaluate_adapter_into(
        args.output_dir,
        args.adapter,
        index,
        catalogue,
        settings,
        model_path=args.model_name_or_path,
        parts=tuple(args.splits),
    )
    print(markdown_table(evaluation.metrics, title=f"Evaluation of {args.adapter}"))
    return 0


COMMAND = Command(
    name="evaluate",
    help="decode the top-K items of valid/test users with the SID-constrained beam search and score them",
    description=DESCRIPTION,
    settings=settings,
    run=run,
)


parser = COMMAND.parser
parse = COMMAND.parse  # (EvaluateArguments, EvalSettings) from arguments (and --config FILE.yaml)
