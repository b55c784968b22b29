"""Training the new items' rows of a grown adapter, every other weight frozen: on their text (incremental
grounding, :func:`ground_new_items`) and on the interactions logged since training
(:func:`tune_new_items_on_log`, with :func:`held_out_log` keeping a sample of the log out for the choices made
on it).

Incremental grounding: GTI pairs of the new items only, training only the rows their SIDs use. After
:func:`~peft_grounded.new_items.grow_adapter`, :func:`ground_new_items` runs a few steps of the grounding
stage's own trainer (:class:`~peft_grounded.training.grounding.GroundingTrainer`, settings an
:class:`IncrementalGroundingConfig`, a :class:`~peft_grounded.training.stage_config.GroundingConfig` with the defaults of a
few seconds' top-up) on the grounding pairs (text -> SID, SID -> text) of the items the child index added.
Every other weight is frozen, and the trainer's row mask (``GroundingTrainer(rows=...)``) keeps every row
outside the trained ones bit-identical (a zero gradient from the first step gives AdamW without weight decay a
zero update): ``rows="used"`` trains the rows of every token a new item's SID uses (shared prefixes included),
``rows="new"`` only the tokens the child added. A stacked LoRA is left as it is (frozen). Seconds on a CPU for a
few hundred items, not a rerun. With ``output_dir`` set the run keeps its checkpoints, manifest and loss log
there and resumes like any grounding run (``resume_from_checkpoint``); without, it runs in a temporary folder.

``replay`` mixes in the pairs of a seeded sample of the parent's items (``replay`` old items per new
one). They train the same rows only, but they keep those rows calibrated: on the new items' pairs
alone, the shared rows learn that "a SID" means "a new item", and the recommender then gives new
items far more of its slots than their share of the targets.
"""

from __future__ import annotations

import contextlib
import json
import random
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from ..sids.extended_base import FINGERPRINT_KEY, sid_record
from ..training.grounding import GroundingData, grounding_dataset
from ..training.stage_config import GroundingConfig

if TYPE_CHECKING:
    from ..sids.index import SIDIndex


@dataclass
class IncrementalGroundingConfig(GroundingConfig):
    """``GroundingConfig`` for grounding the new items of a grown adapter (:func:`ground_new_items`).

    Defaults of a top-up rather than a stage: 30 steps (0: count the pairs, take no step), 8 pairs per step,
    a constant learning rate without warm-up, a loss logged every step, bf16 off; no weight decay (it would
    move the rows outside the mask). ``output_dir`` None: a temporary folder, removed afterwards.
    """

    default_steps: ClassVar[int] = 30
    min_steps: ClassVar[int] = 0

    replay: float = field(
        default=1.0,
        metadata={"help": "Old items per new item whose pairs are mixed in (0: the new items alone)."},
    )
    rows: Literal["used", "new"] = field(
        default="used",
        metadata={"help": "Rows that train: every token a new item's SID uses, or only the new tokens."},
    )
    per_device_train_batch_size: int = field(default=8, metadata={"help": "Text <-> SID pairs per step."})
    lr_scheduler_type: str = field(default="constant", metadata={"help": "Learning-rate schedule."})
    warmup_ratio: float = field(default=0.0, metadata={"help": "Share of the steps spent warming up."})
    logging_steps: float = field(default=1, metadata={"help": "Steps between loss logs."})
    bf16: bool | None = field(
        default=False,
        metadata={
            "help": "bf16 mixed precision (CPU with AVX-512 bf16, or GPU); None: the machine's choice.",
            "nargs": "?",
            "const": True,
        },
    )

    def __post_init__(self) -> None:
        from .. import checks

        self.temporary_output = self.output_dir is None
        checks.raise_problems(
            "incremental grounding",
            [
                checks.one_of("rows", self.rows, ("used", "new"), flag="--rows"),
                None
                if checks.is_number(self.replay) and self.replay >= 0
                else "replay must be >= 0 (old items per new item; 0: the new items alone), got "
                f"{self.replay!r} (--replay)",
                checks.int_at_least(
                    "max_steps",
                    self.max_steps,
                    0,
                    flag="--max_steps; 0: count the pairs, take no step",
                    none_ok=True,
                ),
                None
                if self.weight_decay == 0
                else f"weight_decay must be 0 (decay would move the rows outside the mask), got {self.weight_decay!r}",
            ],
        )
        super().__post_init__()


def incremental_config(
    args: IncrementalGroundingConfig | None = None, **settings: Any
) -> IncrementalGroundingConfig:
    """``args``, or an :class:`IncrementalGroundingConfig` from keyword settings (its fields)."""
    if args is not None:
        if settings:
            raise TypeError(
                f"pass an IncrementalGroundingConfig or keyword settings, not both ({sorted(settings)})"
            )
        return args
    return IncrementalGroundingConfig(**settings)


@dataclass
class _NewItemsView:
    """The part of a SID index :func:`grounding_examples` reads, restricted to some items."""

    index: SIDIndex
    item_ids: list[str]

    def sid_text(self, item_id: str) -> str:
        return self.index.sid_text(item_id)


@dataclass
class IncrementalResult:
    """What :func:`ground_new_items` did."""

    n_items: int
    n_examples: int  # new items' pairs and replayed old items' pairs together
    trained_rows: list[int]  # adapter rows (positions in the token list) that could move
    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0
    n_replayed: int = 0  # old items whose pairs were mixed in


def new_item_ids(parent_index: SIDIndex, child_index: SIDIndex) -> list[str]:
    """The items the child added to the parent (in the child's order)."""
    return list(child_index.item_ids[parent_index.n_items :])


def rows_used(child_index: SIDIndex, item_ids: Sequence[str]) -> list[int]:
    """Token rows (positions in ``child_index.token_strings``) that the SIDs of ``item_ids`` use."""
    offsets = [child_index.token_offset(level) for level in range(child_index.n_levels)]
    rows = {offsets[lv] + code for item in item_ids for lv, code in enumerate(child_index.sid_of(item))}
    return sorted(rows)


def ground_new_items(
    model: Any,
    tokenizer: Any,
    parent_index: SIDIndex,
    child_index: SIDIndex,
    catalogue: Any,
    args: IncrementalGroundingConfig | None = None,
    *,
    data: GroundingData | None = None,
    chat: bool | None = None,
    adapter_name: str | None = None,
    callbacks: list | None = None,
    **settings: Any,
) -> IncrementalResult:
    """Ground the rows of the child's new items in place (see the module doc); returns the losses.

    ``model``: the grown ``PeftModel`` (its adapter must record ``child_index``). ``catalogue``: a
    :class:`~peft_grounded.sids.Catalogue` (or anything with ``.items``) holding the new items' text, and
    the old items' text that ``replay`` samples from. ``args``: the settings (default: an
    :class:`IncrementalGroundingConfig`), or give its fields as keywords (``replay=0, max_steps=6``).
    """
    args = incremental_config(args, **settings)
    name = adapter_name or model.active_adapter
    child_index.check_adapter(model.peft_config[name], recorded=sid_record(model, name).get(FINGERPRINT_KEY))
    new_ids = new_item_ids(parent_index, child_index)
    if not new_ids:
        raise ValueError("the child index adds no items to the parent: nothing to ground")
    if args.rows == "used":
        train_rows = rows_used(child_index, new_ids)
    else:
        train_rows = list(range(parent_index.n_tokens, child_index.n_tokens))
    old_ids = [i for i in parent_index.item_ids if i in catalogue.items]
    n_old = min(len(old_ids), round(args.replay * len(new_ids)))
    if args.replay and not old_ids:
        raise ValueError(
            "replay needs the text of some of the parent's items, and the catalogue holds none of them: pass "
            "the whole catalogue (old and new items), or replay=0 to ground on the new items alone"
        )
    replayed = random.Random(args.seed).sample(old_ids, n_old) if n_old else []
    view = _NewItemsView(child_index, new_ids + replayed)
    dataset = grounding_dataset(catalogue, view, tokenizer, data, chat=chat)
    result = IncrementalResult(
        n_items=len(new_ids), n_examples=len(dataset), trained_rows=train_rows, n_replayed=len(replayed)
    )
    if args.max_steps == 0:
        return result
    if args.temporary_output:
        with tempfile.TemporaryDirectory(prefix="peft-grounded-incremental-") as folder:
            args.output_dir = folder
            try:
                return _train(model, tokenizer, name, dataset, args, callbacks, result)
            finally:
                args.output_dir = None
    return _train(model, tokenizer, name, dataset, args, callbacks, result)


def tune_new_items_on_log(
    model: Any,
    tokenizer: Any,
    parent_index: SIDIndex,
    child_index: SIDIndex,
    catalogue: Any,
    pairs: Sequence[tuple[Sequence[str], str]],
    *,
    max_steps: int = 400,
    learning_rate: float = 3e-3,
    batch_size: int = 8,
    rows: Literal["used", "new"] = "used",
    seed: int = 0,
    bf16: bool = False,
) -> IncrementalResult:
    """Train the rows of the child's new items on logged ``(history, next item)`` pairs, with the adapter's own
    next-item objective and prompt format, in place; every other weight (the stacked LoRA included) frozen.

    Grounding on text (:func:`ground_new_items`) tells the rows what a new item is; the log tells them who
    goes on to it, so the model's beams can reach new items that the text alone would not rank. Each pair
    trains as the window the model sees at inference (its last ``max_history`` items, then the next item);
    with the sequence objective every transition of the window is a target, the old ones keeping the shared
    rows calibrated. ``rows`` as :class:`IncrementalGroundingConfig`'s. The pairs must hold no interaction
    scored later (the new-item protocol's ``logged_pairs``, in ``benchmarks/new_item_protocol.py``, gives the
    positions before them).
    """
    from ..sids.catalogue import LeaveOneOut, UserSplit
    from ..sids.extended_base import prompt_format_of
    from ..training.grounding import rows_only
    from ..training.sft.recommendation_trainer import train_recommender
    from ..training.stage_config import RecommendationConfig

    name = model.active_adapter
    child_index.check_adapter(model.peft_config[name], recorded=sid_record(model, name).get(FINGERPRINT_KEY))
    new_ids = new_item_ids(parent_index, child_index)
    if not new_ids:
        raise ValueError("the child index adds no items to the parent: nothing to tune")
    unknown = sorted({i for history, target in pairs for i in (*history, target) if i not in child_index})
    if unknown:
        raise ValueError(
            f"{len(unknown)} logged items have no SID in the grown index (e.g. {unknown[:3]}): add them first "
            "(peft-grounded add-items), or drop those interactions from the log"
        )
    fmt = prompt_format_of(model)
    width = fmt.max_history + 1 if fmt.max_history else None
    windows = [(*history, target)[-width:] if width else (*history, target) for history, target in pairs]
    windows = [w for w in windows if len(w) >= 2]
    if not windows:
        raise ValueError("no logged pair holds a history and a next item: nothing to tune on")
    log = LeaveOneOut(tuple(UserSplit(f"log-{i}", w, "", "") for i, w in enumerate(windows)))
    train_rows = (
        rows_used(child_index, new_ids)
        if rows == "used"
        else list(range(parent_index.n_tokens, child_index.n_tokens))
    )
    result = IncrementalResult(n_items=len(new_ids), n_examples=len(windows), trained_rows=train_rows)
    with only_rows_trainable(model, name), tempfile.TemporaryDirectory(prefix="peft-grounded-log-") as folder:
        args = RecommendationConfig(
            output_dir=folder,
            max_steps=max_steps,
            learning_rate=learning_rate,
            per_device_train_batch_size=batch_size,
            lr_scheduler_type="constant",
            warmup_ratio=0.0,
            weight_decay=0.0,
            logging_steps=1,
            save_steps=max(max_steps, 1),
            seed=seed,
            bf16=bf16,
            disable_tqdm=True,
        )
        start = time.perf_counter()
        with rows_only(model, train_rows), contextlib.redirect_stdout(sys.stderr):
            train_recommender(
                catalogue, child_index, args, model=model, tokenizer=tokenizer, lora=False, fmt=fmt, split=log
            )
        result.seconds = time.perf_counter() - start
        history = json.loads((Path(folder) / "log_history.json").read_text())
        result.losses = [float(e["loss"]) for e in history if "loss" in e]
    return result


@contextlib.contextmanager
def only_rows_trainable(model: Any, name: str) -> Iterator[None]:
    """Within: the grounded matrices of adapter ``name`` are the only trainable weights; trainability, dtypes
    (a trainer keeps half-precision rows in float32 while they train) and the train/eval mode restored after."""
    layer = model.get_input_embeddings()
    params = [layer.grounded_embedding[name]]
    if name in layer.grounded_head:
        params.append(layer.grounded_head[name])
    states = {p: (p.requires_grad, p.dtype) for p in model.parameters()}
    was_training = model.training
    try:
        for p in model.parameters():
            p.requires_grad_(False)
        for p in params:
            p.requires_grad_(True)
        yield
    finally:
        for p, (flag, dtype) in states.items():
            if p.dtype != dtype:
                p.data = p.data.to(dtype)
            p.requires_grad_(flag)
        model.train(was_training)


def _train(
    model, tokenizer, name: str, dataset, args, callbacks, result: IncrementalResult
) -> IncrementalResult:
    """Train the grounded rows of adapter ``name`` (only ``result.trained_rows``) with a ``GroundingTrainer``;
    every other weight frozen meanwhile. Trainability, dtypes and the train/eval mode are restored after."""
    from ..training.grounding import GroundingTrainer

    with only_rows_trainable(model, name):
        trainer = GroundingTrainer(
            model,
            args,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=callbacks,
            rows=result.trained_rows,
        )
        start = time.perf_counter()
        with contextlib.redirect_stdout(sys.stderr):  # the trainer's loss lines: stdout stays the caller's
            trainer.train()
        result.seconds = time.perf_counter() - start
        result.losses = [float(e["loss"]) for e in trainer.state.log_history if "loss" in e]
    return result


def held_out_log(histories: list, held: int = 500, seed: int = 0) -> tuple[list, list]:
    """``(held out, the rest)``: a seeded sample of up to ``held`` logged histories (at most half of them)
    for choices made on the log, and the others to train on."""
    order = random.Random(seed).sample(range(len(histories)), len(histories))
    cut = min(held, len(histories) // 2)
    if cut == 0 or cut == len(histories):
        raise ValueError(
            f"{len(histories)} logged histories: tuning on the log holds some out for the beam choice and "
            "trains on the rest, so it needs at least two"
        )
    return [histories[i] for i in order[:cut]], [histories[i] for i in order[cut:]]
