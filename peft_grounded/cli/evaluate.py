"""``peft-grounded evaluate``: Recall/NDCG@K of a trained adapter by constrained beam search
(:func:`peft_grounded.evaluation.evaluate_adapter`); ``peft-grounded fuse-peer``: a SASRec peer stored with the
adapter, fused with its beams (:mod:`peft_grounded.serving.peer_fusion`), its weight chosen on the validation
users, so that ``evaluate`` and ``recommend`` serve the fused lists.

The flags are the fields of :class:`EvaluateArguments` (:class:`FusePeerArguments`) and
:class:`~peft_grounded.evaluation.EvalSettings` (which users, and how they are decoded), parsed by TRL's parser;
``--config FILE.yaml`` gives any of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .common import Command, catalogue_field

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
class AdapterArguments:
    """A trained adapter and the data it was trained on (the fields ``evaluate`` and ``fuse-peer`` share)."""

    adapter: str = field(metadata={"help": "Trained adapter directory (e.g. OUTPUT_DIR/adapter of `sft`)."})
    sid_index: str = field(metadata={"help": "SID index directory the adapter was trained with."})
    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Local base model directory; None: the base recorded in the adapter."},
    )
    catalogue: str | None = catalogue_field()


@dataclass
class EvaluateArguments(AdapterArguments):
    """The adapter to evaluate, its data, and where the results go."""

    output_dir: str = field(
        kw_only=True, metadata={"help": "Directory for metrics.json/.md, likelihood.json, users.json."}
    )
    splits: list[str] = field(
        default_factory=lambda: list(PARTS), metadata={"help": "Parts of the split to evaluate: valid, test."}
    )
    peer_fusion: bool = field(
        default=True,
        metadata={
            "help": "Serve the peer fusion stored with the adapter (fuse-peer), when there is one; "
            "--no_peer_fusion: the model's lists alone."
        },
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
    from ..evaluation.evaluator import describe_served, evaluate_adapter_into
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
        peer_fusion=args.peer_fusion,
        show_progress=True,
    )
    print(markdown_table(evaluation.metrics, title=f"Evaluation of {args.adapter}"))
    print(describe_served(next(iter(evaluation.metrics.values()))["decoding"]["served"]))
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


FUSE_DESCRIPTION = (
    "Fit (or read) a SASRec peer on the adapter's training split, choose the weight of its log-probabilities "
    "in the fused score log p_model + w log p_SASRec on the validation users (--reference_weight unless the "
    "best of --weights by Recall@10, then NDCG@10, beats it with a paired 95% interval above 0), and "
    "store the peer and the weight in the adapter's folder: evaluate and recommend then serve the fused lists "
    "(evaluate --no_peer_fusion: the model alone). Prints the validation table with the model alone and the "
    "peer alone beside each weight. Test users are never read. Of the evaluation settings it reads --users, "
    "--seed, --num_beams, --decode_batch_size and --bf16 (the validation users and how they are decoded)."
)


@dataclass
class FusePeerArguments(AdapterArguments):
    """The adapter (the fusion is written into its folder), its data, and the peer."""

    peer: str | None = field(
        default=None,
        metadata={
            "help": "A saved SASRec folder to fuse (e.g. OUTPUT_DIR/teacher of a distilled sft run); None: "
            "fit SASRec on the training split (cached, so the same data and seed give the same peer)."
        },
    )
    peer_seed: int = field(default=0, metadata={"help": "Seed of the fitted peer (without --peer)."})
    weights: list[float] = field(
        default_factory=lambda: list(_default_weights()),
        metadata={
            "help": "Candidate weights w of the peer's log-probabilities; one is chosen on validation."
        },
    )
    reference_weight: float = field(
        default_factory=lambda: _reference_weight(),
        metadata={
            "help": "The weight served unless the best of --weights beats it on the validation users with a "
            "paired 95%% interval of Recall@10 above 0."
        },
    )
    depth: int = field(default=20, metadata={"help": "The peer's best items added to the model's beams."})

    def __post_init__(self) -> None:
        from .. import checks

        weights = bool(self.weights) and all(checks.is_number(w) and w > 0 for w in self.weights)
        reference = checks.is_number(self.reference_weight) and self.reference_weight > 0
        checks.raise_problems(
            "fuse-peer",
            [
                None
                if weights
                else f"--weights are numbers > 0 (e.g. --weights 0.5 1 2), got {self.weights}",
                None
                if reference
                else f"--reference_weight is a number > 0 (1: two equal experts), got {self.reference_weight}",
                None
                if checks.is_int(self.depth) and self.depth >= 1
                else f"--depth is an integer >= 1, got {self.depth}",
                checks.seed("peer_seed", self.peer_seed, flag="--peer_seed"),
            ],
        )


def _default_weights() -> tuple[float, ...]:
    from ..serving.peer_fusion import DEFAULT_WEIGHTS

    return DEFAULT_WEIGHTS


def _reference_weight() -> float:
    from ..serving.peer_fusion import REFERENCE_WEIGHT

    return REFERENCE_WEIGHT


def fuse_settings() -> tuple[type, ...]:
    from ..evaluation.metrics import EvalSettings

    return (FusePeerArguments, EvalSettings)


def run_fuse(args: FusePeerArguments, settings: EvalSettings) -> int:
    """Fit the fusion on the validation users and write it into the adapter's folder (locked)."""
    from pathlib import Path

    import torch

    from .._io import output_lock
    from ..evaluation.peers import fit_peer_fusion
    from ..new_items.rule import RULE_FILES
    from ..serving.peer_fusion import PeerFusionError, item_difference
    from ..sids.extended_base import base_model_path, sid_model
    from ..sids.sasrec import SASRecConfig, SASRecRecommender
    from ..sids.sasrec_cache import shared_fit
    from .common import load_data

    if (Path(args.adapter) / RULE_FILES[0]).is_file():
        raise ValueError(
            f"{args.adapter} holds a new-item rule ({RULE_FILES[0]}), and a peer knows no item added after it "
            "was fitted: fuse the adapter trained before the index grew, or delete the rule's files first"
        )
    catalogue, index = load_data(args.catalogue, args.sid_index)
    split = catalogue.leave_one_out()
    given = None
    if args.peer:  # checked before the adapter's folder is locked or the model loads
        given = SASRecRecommender.load(
            args.peer,
            fix="pass --peer a folder that SASRecRecommender.save wrote (e.g. OUTPUT_DIR/teacher of an sft run "
            "with --distill_weight), or omit --peer to fit one",
        )
        difference = item_difference(given.item_ids, index.item_ids)
        if difference:
            raise PeerFusionError(
                f"--peer {args.peer}: the peer there was fitted on other items than the SID index "
                f"{args.sid_index} ({difference}); pass the peer fitted for this index (e.g. OUTPUT_DIR/teacher of "
                "an sft run on it), or omit --peer to fit one"
            )
    with output_lock(args.adapter, "fuse-peer"):
        peer = (
            given
            if given is not None
            else shared_fit(split, index.item_ids, SASRecConfig(seed=args.peer_seed), show_progress=True)
        )
        dtype = torch.bfloat16 if settings.bf16 else torch.float32
        tokenizer, model = sid_model(
            args.model_name_or_path or base_model_path(args.adapter),
            index,
            adapter=args.adapter,
            is_trainable=False,
            dtype=dtype,
        )
        fusion = fit_peer_fusion(
            model,
            tokenizer,
            index,
            split,
            peer,
            settings,
            catalogue=catalogue,
            weights=args.weights,
            reference=args.reference_weight,
            depth=args.depth,
            show_progress=True,
        )
        fusion.save(args.adapter)
    users, reference = fusion.fitted_on["users"], fusion.fitted_on["reference"]
    print(f"| weight | Recall@10 | minus w={reference:g}, paired | NDCG@10 |  ({users} validation users)")
    print("|---|---|---|---|")
    labels = {None: "the model alone", "peer": "the peer alone"}
    for row in fusion.fitted_on["table"]:
        label = labels.get(row["weight"], row["weight"])
        gap = row.get("recall@10_minus_reference")
        paired = f"{gap['difference']:+.4f} [{gap['low']:+.4f}, {gap['high']:+.4f}]" if gap else ""
        print(f"| {label} | {row['recall@10']:.4f} | {paired} | {row['ndcg@10']:.4f} |")
    print(f"{fusion.describe()}; written to {args.adapter}")
    return 0


FUSE_PEER = Command(
    name="fuse-peer",
    help="store a SASRec peer with an adapter, fused with its beams (the weight checked on validation)",
    description=FUSE_DESCRIPTION,
    settings=fuse_settings,
    run=run_fuse,
)
