"""Growing a catalogue from the command line (see :mod:`peft_grounded.new_items`):

* ``peft-grounded add-items``: a new version of a SID index with new items
  (:func:`~peft_grounded.new_items.add_items`; the command as a function:
  :func:`~peft_grounded.new_items.add_items_to`);
* ``peft-grounded grow-adapter``: a saved adapter grown onto that version
  (:func:`~peft_grounded.new_items.grow_adapter`), optionally grounding the new items
  (:func:`~peft_grounded.new_items.ground_new_items`) and fitting the new-item rule on logged interactions;
  :func:`grow_adapter_into` (below) is the command as a function (it loads the adapter and, for the rule's
  choices, serves it: it sits above serving, with the command).

The flags are the fields of the dataclasses below (and :class:`~.common.CatalogueArguments`,
:class:`~.common.EncodingArguments`), parsed by TRL's parser; ``--config FILE.yaml`` gives any of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from .._io import locks_output
from .common import CatalogueArguments, Command, EncodingArguments

if TYPE_CHECKING:
    from ..new_items.row_training import IncrementalGroundingConfig


@dataclass
class GrowAdapterArguments:
    """The trained adapter, the parent and child indexes, the base model and where the grown adapter goes."""

    adapter: str = field(metadata={"help": "The trained adapter's directory (trained on --parent_index)."})
    parent_index: str = field(metadata={"help": "Directory of the SID index the adapter was trained on."})
    sid_index: str = field(
        metadata={"help": "Directory of the child index (from `peft-grounded add-items --sid-index PARENT`)."}
    )
    output_dir: str = field(metadata={"help": "Directory of the grown adapter."})
    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Local base model directory; None: the base recorded in the adapter."},
    )
    dtype: Literal["float32", "bfloat16"] = field(
        default="float32",
        metadata={"help": "dtype of the frozen base's weights (adapter rows and LoRA stay float32)."},
    )
    init: Literal["centroid", "mean", "gaussian", "random"] = field(
        default="centroid",
        metadata={
            "help": "How the new tokens' rows start (centroid: the child's item centroids projected with the "
            "parent's tokens)."
        },
    )
    interactions: str | None = field(
        default=None,
        metadata={
            "help": 'JSONL of histories logged since the adapter was trained ({"user": ID, "history": [...]}, '
            "newest item last): fit the new-item rule on it and store it with the grown adapter, so that "
            "`recommend` serves the new items."
        },
    )
    catalogue: str | None = field(
        default=None,
        metadata={
            "help": "With --interactions: every item's text (any format build-sids reads; it must hold every item "
            "of --sid_index). On an index built from behaviour the new-item rule ranks its items by their text, "
            "read from here. None: the index's own catalogue (its build's, with the items add-items read), when "
            "it is at hand; else it warns and uses the index's text-mapped behaviour vectors."
        },
    )
    log_steps: int = field(
        default=0,
        metadata={
            "help": "With --interactions: tune the new items' rows on the logged histories for this many steps "
            "(their next items as targets, the adapter's own objective, every other weight frozen) before the "
            "rule chooses its beams on a held-out sample of them (up to 500, at most half). 0: off."
        },
    )
    log_learning_rate: float = field(default=3e-3, metadata={"help": "Learning rate of --log_steps."})
    overwrite: bool = field(
        default=False,
        metadata={
            "help": "Replace an adapter already in --output_dir (its config, weights and PEFT's card, and its "
            "new-item rule and peer fusion, fitted for its index: fuse-peer again; other files are kept)."
        },
    )

    def __post_init__(self) -> None:
        from .. import checks

        checks.raise_problems(
            "grow-adapter",
            [
                checks.int_at_least(
                    "log_steps", self.log_steps, 0, flag="--log_steps; 0: no tuning on the log"
                ),
                checks.number_in(
                    "log_learning_rate", self.log_learning_rate, 0, low_open=True, flag="--log_learning_rate"
                ),
                "--log_steps tunes the new items' rows on the logged interactions: give them with "
                "--interactions FILE, or leave --log_steps at 0"
                if checks.is_int(self.log_steps) and self.log_steps > 0 and self.interactions is None
                else None,
            ],
        )


def _unset(help: str) -> Any:
    """A field left None unless given (None: the config's default; a bool field then takes --flag alone)."""
    return field(default=None, metadata={"help": help})


@dataclass
class IncrementalGroundingArguments:
    """Incremental grounding of the new items' rows (with --ground): the fields of
    :class:`~peft_grounded.new_items.IncrementalGroundingConfig` (a ``GroundingConfig``) that the command
    takes, under the config's names; None: the config's default."""

    _argument_group_name = "incremental grounding (with --ground)"

    ground: str | None = field(
        default=None,
        metadata={
            "help": "Ground the new items' rows on this catalogue's text (any format build-sids reads; it needs "
            "the old items' text too for --replay, else pass --replay 0).",
            "metavar": "CATALOGUE",
        },
    )
    max_steps: int | None = _unset(
        "Steps of incremental grounding (0: count the pairs, take no step); None: 30."
    )
    replay: float | None = _unset(
        "Old items per new item whose pairs are mixed in (0: the new items alone); None: 1."
    )
    rows: Literal["used", "new"] | None = _unset(
        "Rows that train: every token a new item's SID uses, or only the new tokens; None: used."
    )
    learning_rate: float | None = _unset("Learning rate; None: 1e-3.")
    per_device_train_batch_size: int | None = _unset("Text <-> SID pairs per step; None: 8.")
    seed: int | None = _unset("Seed of the replay sample and the batch order; None: 0.")
    bf16: bool = _unset("bf16 mixed precision (CPU with AVX-512 bf16, or GPU); default off.")
    grounding_dir: str | None = _unset(
        "Folder of the grounding run (checkpoints, run.json, log_history.json), the config's output_dir; None: "
        "a temporary folder, removed afterwards."
    )

    def __post_init__(self) -> None:
        self.config = self.to_config()  # checked now, before anything loads (with or without --ground)

    def to_config(self) -> Any:
        """The :class:`~peft_grounded.new_items.IncrementalGroundingConfig` these settings give."""
        from dataclasses import fields

        from ..new_items.row_training import IncrementalGroundingConfig

        given = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in ("ground", "grounding_dir") and getattr(self, f.name) is not None
        }
        return IncrementalGroundingConfig(output_dir=self.grounding_dir, **given)


@locks_output("output", "grow-adapter")
def grow_adapter_into(
    adapter: str | Path,
    parent_index: str | Path,
    sid_index: str | Path,
    output: str | Path,
    *,
    model: str | None = None,
    init: str = "centroid",
    weights_dtype: str = "float32",
    overwrite: bool = False,
    ground: str | None = None,
    grounding: IncrementalGroundingConfig | None = None,
    interactions: str | Path | None = None,
    catalogue: Any = None,
    log_steps: int = 0,
    log_learning_rate: float = 3e-3,
) -> dict[str, Any]:
    """Grow the adapter saved in ``adapter`` (trained on ``parent_index``) onto ``sid_index``, ground the new
    items on the catalogue ``ground`` when given (settings: ``grounding``, default an
    :class:`~peft_grounded.new_items.IncrementalGroundingConfig`, checked when it is made), and save it to
    ``output``; returns a summary: the ``grow-adapter`` command as a function.

    ``output`` is locked and checked before anything is loaded; with ``overwrite`` an adapter there is
    replaced, its other files kept. ``interactions``: a JSONL file of histories logged since the adapter was
    trained (``{"user": ..., "history": [...]}``, newest item last): the new-item rule
    (:class:`~peft_grounded.new_items.NewItemRule`) is fitted on it and saved with the grown adapter.
    ``catalogue`` (a :class:`~peft_grounded.sids.Catalogue` or what ``load_catalogue`` reads, holding every item
    of ``sid_index``): the rule's text expert reads the items' text from it, which an index built from behaviour
    needs (:func:`~peft_grounded.new_items.rule_vectors`). ``log_steps`` (with ``interactions``): the new items'
    rows are first tuned on the logged histories for that many steps
    (:func:`~peft_grounded.new_items.tune_new_items_on_log`), all but a seeded sample of up to 500
    (at most half), on which the rule then chooses its beams: the choice never reads a history the rows
    trained on."""
    import sys

    import torch

    from .. import checks
    from ..hub.repo import FUSION_FILES
    from ..new_items.adapter_rows import (
        check_lineage,
        check_output,
        grow_adapter,
        save_adapter_keeping_others,
    )
    from ..new_items.row_training import (
        IncrementalGroundingConfig,
        ground_new_items,
        held_out_log,
        new_item_ids,
    )
    from ..sids import SIDIndex, load_catalogue
    from ..sids.extended_base import base_model_path, sid_model

    output, adapter = Path(output), Path(adapter)
    checks.raise_problems(
        "grow-adapter",
        [
            checks.int_at_least("log_steps", log_steps, 0, flag="--log_steps; 0: no tuning on the log"),
            checks.number_in(
                "log_learning_rate", log_learning_rate, 0, low_open=True, flag="--log_learning_rate"
            ),
        ],
    )
    if log_steps and interactions is None:
        raise ValueError(
            f"log_steps={log_steps} tunes the new items' rows on the logged interactions: give them "
            "(--interactions FILE), or leave --log_steps at 0"
        )
    check_output(output, adapter, overwrite)
    if ground is not None and grounding is None:
        grounding = IncrementalGroundingConfig()
    parent, child = SIDIndex.load(parent_index), SIDIndex.load(sid_index)
    check_lineage(parent, child)  # the refusal grow_adapter gives, before the model is loaded
    rule = None
    if interactions is not None:  # fitted before the model loads: a bad file fails fast
        from ..new_items.rule import NewItemRule
        from ..serving import read_histories
        from ..sids.catalogue_source import catalogue_at_hand

        catalogue = catalogue_at_hand(child, catalogue, needed=False)  # given: checked; else the index's own

        logged = read_histories(interactions)[1]
        rule = NewItemRule.fit(child, logged, new_items=new_item_ids(parent, child), catalogue=catalogue)
        choice_log, tuning_log = held_out_log(logged) if log_steps else (logged, [])
    ground_catalogue = None
    if ground is not None:
        ground_catalogue = load_catalogue(ground)
        new_ids = new_item_ids(parent, child)
        missing = [i for i in new_ids if i not in ground_catalogue.items]
        if new_ids and len(missing) == len(new_ids):
            raise ValueError(
                f"--ground {ground} holds none of the {len(new_ids)} new items (e.g. {missing[0]!r}); "
                "pass the catalogue with their text (the one given to add-items, plus the old items for "
                "--replay)"
            )
        if missing:
            print(
                f"warning: {len(missing)} new items have no text in --ground; they are not grounded",
                file=sys.stderr,
            )

    tokenizer, peft_model = sid_model(
        model or base_model_path(str(adapter)),
        parent,
        adapter=str(adapter),
        dtype=getattr(torch, weights_dtype),
    )
    grown = grow_adapter(peft_model, tokenizer, parent, child, init=init)
    summary: dict[str, Any] = {
        "new_tokens": child.n_tokens - parent.n_tokens,
        "new_items": child.n_items - parent.n_items,
        "rows": child.n_tokens,
        "init": init,
        "fingerprint": child.fingerprint(),
    }
    if ground_catalogue is not None:
        result = ground_new_items(grown, tokenizer, parent, child, ground_catalogue, grounding)
        summary["grounding"] = {
            "seconds": round(result.seconds, 3),
            "steps": len(result.losses),
            "examples": result.n_examples,
            "replayed": result.n_replayed,
            "trained_rows": len(result.trained_rows),
            "loss": [round(result.losses[0], 4), round(result.losses[-1], 4)] if result.losses else None,
        }
    if log_steps:
        from ..new_items.row_training import tune_new_items_on_log
        from ..new_items.rule import calibration_pairs

        text = load_catalogue(catalogue) if isinstance(catalogue, str | Path) else catalogue
        tuned = tune_new_items_on_log(
            grown,
            tokenizer,
            parent,
            child,
            text,
            calibration_pairs(tuning_log, child),
            max_steps=log_steps,
            learning_rate=log_learning_rate,
        )
        summary["log_tuning"] = {
            "seconds": round(tuned.seconds, 3),
            "steps": len(tuned.losses),
            "histories": tuned.n_examples,
            "held_out_for_the_choice": len(choice_log),
            "trained_rows": len(tuned.trained_rows),
            "loss": [round(tuned.losses[0], 4), round(tuned.losses[-1], 4)] if tuned.losses else None,
        }
    if rule is not None:  # whose beams the rule mixes: the grown model's, or text KNN where that wins
        from ..serving import GroundedRecommender
        from ..sids.extended_base import prompt_format_of

        GroundedRecommender(grown, tokenizer, child, prompt_format_of(grown)).choose_new_item_beams(
            rule, choice_log
        )
    check_output(output, adapter, overwrite)  # again: the folder may have changed while this ran
    stale = [name for name in FUSION_FILES if (output / name).exists()]
    kept = save_adapter_keeping_others(grown, output)
    if stale:  # the replaced adapter's peer knows none of the new items: its fusion would be refused
        summary["dropped"] = stale
        print(
            f"dropped the peer fusion of the adapter replaced in {output} ({', '.join(stale)}): it was fitted "
            f"for the parent's SID index; run `peft-grounded fuse-peer --adapter {output} --sid_index "
            f"{sid_index}` again to fuse a peer with the grown adapter",
            file=sys.stderr,
        )
    if rule is not None:
        rule.save(output)
        summary["new_item_rule"] = {"mode": rule.mode, **rule.fitted_on}
    if kept:
        summary["kept"] = kept
    return summary


def run_grow_adapter(args: GrowAdapterArguments, grounding: IncrementalGroundingArguments) -> int:
    """Grow, optionally ground, save; prints a JSON summary and the output path."""
    import json

    summary = grow_adapter_into(
        args.adapter,
        args.parent_index,
        args.sid_index,
        args.output_dir,
        model=args.model_name_or_path,
        init=args.init,
        weights_dtype=args.dtype,
        overwrite=args.overwrite,
        ground=grounding.ground,
        grounding=grounding.config,
        interactions=args.interactions,
        catalogue=args.catalogue,
        log_steps=args.log_steps,
        log_learning_rate=args.log_learning_rate,
    )
    print(json.dumps(summary))
    print(f"saved to {args.output_dir}")
    return 0


GROW_ADAPTER = Command(
    name="grow-adapter",
    help="grow a trained adapter onto an index made by add-items (new items without retraining)",
    description="Load the base with the parent index's tokens and the trained adapter, add the child index's new "
    "tokens (trained rows and LoRA carried over bit for bit, new rows from --init), optionally ground the new "
    "items' rows on their text <-> SID pairs (--ground), and save the grown adapter to --output_dir (written "
    "beside it, then renamed into place).",
    settings=lambda: (GrowAdapterArguments, IncrementalGroundingArguments),
    run=run_grow_adapter,
)


@dataclass
class AddItemsArguments:
    """The parent index, the new items and where the new index version goes."""

    sid_index: str = field(metadata={"help": "Directory of the parent SID index."})
    catalogue: str = field(metadata={"help": "The new items (any format build-sids reads)."})
    output_dir: str = field(metadata={"help": "Directory of the new index version."})
    encoder: str | None = field(
        default=None,
        metadata={
            "help": "The index's encoder as a build-sids spec (None: minilm when the index was built with the "
            "packaged MiniLM); another encoder is refused."
        },
    )
    skip_problems: bool = field(
        default=False,
        metadata={
            "help": "Leave out items already in the index or repeated in the batch (listed) instead of failing."
        },
    )
    overwrite: bool = field(default=False, metadata={"help": "Replace an index already in --output_dir."})


def run_add_items(args: AddItemsArguments, catalogue: CatalogueArguments, encoding: EncodingArguments) -> int:
    import json
    import logging

    from ..new_items.grow_index import GrowthReport, add_items_to

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    output = Path(args.output_dir).resolve()
    report = GrowthReport()
    child = add_items_to(
        args.sid_index,
        args.catalogue,
        output,
        overwrite=args.overwrite,
        encoder=args.encoder,
        on_problem="skip" if args.skip_problems else "error",
        **encoding.keywords(),
        catalogue_format=catalogue.catalogue_format,
        catalogue_options=catalogue.catalogue_options() or None,
        report=report,
    )
    print(report.summary())
    print(json.dumps({"parent": child.parent, "fingerprint": child.fingerprint(), "n_items": child.n_items}))
    print(f"saved to {output}")
    return 0


ADD_ITEMS = Command(
    name="add-items",
    help="add new items to a SID index (a new version; existing SIDs unchanged)",
    description="Encode the new items with the index's encoder and text template, code them with its codebooks, "
    "resolve collisions through the disambiguation level (new tokens are appended) and write a new index "
    "version whose parent is the given one. Grow a trained adapter onto it with `peft-grounded grow-adapter` "
    "(or peft_grounded.new_items.grow_adapter).",
    settings=lambda: (AddItemsArguments, CatalogueArguments, EncodingArguments),
    run=run_add_items,
)
