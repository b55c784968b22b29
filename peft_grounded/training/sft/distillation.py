"""Distillation from the fast peer (issue 40, item 3): SASRec's next-item distribution as soft SID targets.

For every SID target token of every training row, the teacher (a SASRec trained on the same training split;
validation picks its epoch; no test item is read) reads the items before the target: the user's training
history before it for the rows of the split, the altered history for augmentation copies, its last
``max_length`` items either way. Its next-item distribution ``p`` (over every item, seen ones included, as
the student's softmax) is summed onto the SID trie level by level,
teacher-forced like the student: level 1, ``q(c)`` = the mass of the items whose first code is ``c``; level
``l``, given the target's true codes of the levels before, ``q(c)`` = the mass of the items with that prefix and
code ``c`` over the prefix's mass. Each level keeps its ``top_k`` codes, renormalised, as SID token ids and
probabilities (:func:`trie_distributions`).

The targets travel as two dataset columns, :data:`TEACHER_COLUMNS`: per row, one ``[top_k]`` list per labelled
SID token, in the row's order. :class:`TeacherCollator` concatenates a batch's rows into ``[N, top_k]`` tensors,
``N`` = the batch's labelled SID tokens in row-major order, which is the order the compact head scores them in,
padded and padding-free alike. The loss itself is the trainer's
(:meth:`~peft_grounded.training.sft.recommendation_trainer.RecommendationTrainer.compute_loss`).

:func:`with_teacher` caches the teacher and its targets in ``<output_dir>/teacher/`` (each file written
atomically, the JSON that vouches for them last), so that a resumed run trains on the very same targets: a
SASRec fitted under a time budget depends on the machine's speed.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from ..._io import atomic_write, atomic_write_text
from ...prompts import PromptFormat

logger = logging.getLogger(__name__)

TEACHER_COLUMNS = ("teacher_ids", "teacher_probs")
TEACHER_DIR = "teacher"  # under the run's output folder
TARGETS_FILE, RECORD_FILE = "targets.safetensors", "teacher.json"
FORMAT = "peft_grounded.teacher_targets"
_BATCH = 512  # targets the teacher scores at once


# ------------------------------------------------------------------------------------------------ the trie


def trie_distributions(
    probs: torch.Tensor,
    targets: torch.Tensor,
    codes: torch.Tensor,
    codes_per_level: Sequence[int],
    top_k: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher's distribution over each level's codes, teacher-forced on the target's SID.

    ``probs`` ``[B, n_items]``: next-item probabilities over the index's items; ``targets`` ``[B]``: the target's
    item row; ``codes`` ``[n_items, levels]``. Returns ``(code [B, levels, top_k], probability [B, levels, top_k])``:
    each level's ``top_k`` most likely codes given the target's codes of the levels before, renormalised over
    the kept ones; a level with fewer codes pads with probability 0 (on its most likely code). A prefix without
    mass (underflow) takes the target's own code."""
    batch, levels = probs.shape[0], codes.shape[1]
    true = codes[targets]  # [B, levels]
    within = probs.clone()
    out_codes = torch.zeros(batch, levels, top_k, dtype=torch.long)
    out_probs = torch.zeros(batch, levels, top_k, dtype=probs.dtype)
    for level, size in enumerate(codes_per_level):
        column = codes[:, level]
        q = within.new_zeros(batch, size).scatter_add_(1, column.expand(batch, -1), within)
        mass = q.sum(1, keepdim=True)
        q = torch.where(mass > 0, q / mass.clamp_min(torch.finfo(q.dtype).tiny), 0.0)
        empty = mass.squeeze(1) <= 0
        q[empty, true[empty, level]] = 1.0
        kept = min(top_k, size)
        values, chosen = q.topk(kept, dim=1)
        out_probs[:, level, :kept] = values / values.sum(1, keepdim=True)
        out_codes[:, level, :kept] = chosen
        out_codes[:, level, kept:] = chosen[:, :1]
        within = within * (column[None, :] == true[:, level, None])
    return out_codes, out_probs


def keep_confident(
    out_codes: torch.Tensor,
    out_probs: torch.Tensor,
    true: torch.Tensor,
    confidence: torch.Tensor,
    share: float,
) -> None:
    """In place: keep the teacher's distributions (``[N, levels, top_k]`` codes and probabilities) on the
    ``share`` of the ``N`` targets of highest ``confidence`` (ties: the earlier target), and give the others
    their true codes ``true`` ``[N, levels]`` as one-hot targets, under which the soft cross-entropy is the
    target's own cross-entropy: those targets are not distilled."""
    n = confidence.numel()
    kept = round(share * n)
    if kept >= n:
        return
    order = torch.sort(-confidence, stable=True).indices
    plain = order[kept:]
    out_codes[plain] = true[plain, :, None].expand(-1, -1, out_codes.shape[2])
    out_probs[plain] = 0.0
    out_probs[plain, :, 0] = 1.0


def level_token_ids(index, tokenizer) -> list[torch.Tensor]:
    """Per level, the token id of each code (``index.token_strings`` under ``tokenizer``)."""
    strings = index.token_strings
    ids = tokenizer.convert_tokens_to_ids(strings)
    unknown = getattr(tokenizer, "unk_token_id", None)
    missing = [
        s for s, i in zip(strings, ids, strict=True) if i is None or (unknown is not None and i == unknown)
    ]
    if missing:
        raise ValueError(
            f"{len(missing)} SID tokens (e.g. {missing[0]}) are not in the tokenizer: add them "
            "(peft_grounded.add_tokens) before building the teacher's targets"
        )
    ids = torch.tensor(ids, dtype=torch.long)
    return [
        ids[index.token_offset(level) : index.token_offset(level) + size]
        for level, size in enumerate(index.codes_per_level)
    ]


# ------------------------------------------------------------------------------------------------ the rows


@dataclass(frozen=True)
class Row:
    """What one training row predicts: ``items[first:]`` are its targets, in order; the teacher reads the items
    before each target."""

    items: tuple[str, ...]
    first: int

    @property
    def targets(self) -> int:
        return len(self.items) - self.first


def training_rows(split, fmt: PromptFormat, augment=None) -> list[Row]:
    """The rows of :func:`~.data.training_dataset` (every user, ``fmt``'s objective, ``augment``'s copies),
    in its order. Sequence rows: one per chunk (its targets: the chunk's items after the first), the user's
    history before the chunk readable by the teacher; prompt rows: one per training transition."""
    from .data import chunk_bounds

    if fmt.objective == "sequence":
        max_items = fmt.max_history + 1 if fmt.max_history else None
        spans = [
            (user.history, start, stop)
            for user in split.users
            for start, stop in chunk_bounds(len(user.history), max_items)
        ]
        rows = [Row(tuple(history[:stop]), start + 1) for history, start, stop in spans]
        if augment is not None:
            views = augment.views([history[start:stop] for history, start, stop in spans], min_items=2)
            rows += [Row(tuple(view), 1) for view in views]
        return rows
    triples = list(split.train_examples(fmt.max_history))
    users = {user.user_id: user.history for user in split.users}
    positions = [t for user in split.users for t in range(1, len(user.history))]
    rows = [Row(tuple(users[user][: t + 1]), t) for (user, _, _), t in zip(triples, positions, strict=True)]
    if augment is not None:
        views = augment.views([history for _, history, _ in triples], min_items=1)
        rows += [Row((*view, target), len(view)) for (_, _, target), view in zip(triples, views, strict=True)]
    return rows


# ------------------------------------------------------------------------------------------------ targets


@dataclass
class TeacherTargets:
    """The soft targets of every target item, rows after rows: ``ids`` (int32 SID token ids) and ``probs``
    (float32), ``[targets, levels, top_k]``; ``counts`` ``[rows]`` (target items per row)."""

    ids: torch.Tensor
    probs: torch.Tensor
    counts: torch.Tensor

    def tensors(self) -> dict[str, torch.Tensor]:
        return {
            "ids": self.ids.contiguous(),
            "probs": self.probs.contiguous(),
            "counts": self.counts.contiguous(),
        }


def teacher_targets(
    teacher, rows: Sequence[Row], index, tokenizer, top_k: int, confident_share: float = 1.0
) -> TeacherTargets:
    """``teacher``'s (a :class:`~peft_grounded.sids.sasrec.SASRecRecommender`) soft targets for ``rows``:
    each target read after at most ``max_length`` items, the distributions summed onto ``index``'s trie.
    ``confident_share`` < 1 keeps them on that share of the targets where the teacher's top item is most
    likely (:func:`keep_confident`); the others get their own SID as a one-hot target."""
    teacher_index = {item: i + 1 for i, item in enumerate(teacher.item_ids)}
    missing = sorted({i for row in rows for i in row.items if i not in teacher_index})
    if missing:
        raise ValueError(f"{len(missing)} training items (e.g. {missing[0]!r}) are unknown to the teacher")
    length = teacher.model.max_length
    prefixes, wanted = [], []
    for row in rows:
        seq = [teacher_index[i] for i in row.items]
        for t in range(row.first, len(seq)):
            prefixes.append(seq[max(0, t - length) : t])
            wanted.append(index.row_of(row.items[t]))
    # teacher column j -> the index's row of that item (items the index lacks carry no SID: left out)
    columns = torch.tensor([index.row_of(i) if i in index else -1 for i in teacher.item_ids])
    same = torch.equal(columns, torch.arange(index.n_items))
    codes = torch.as_tensor(index.codes, dtype=torch.long)
    wanted = torch.tensor(wanted, dtype=torch.long)
    n, levels = len(prefixes), index.n_levels
    out_codes = torch.zeros(n, levels, top_k, dtype=torch.long)
    out_probs = torch.zeros(n, levels, top_k, dtype=torch.float32)
    confidence = torch.zeros(n, dtype=torch.float64)
    order = sorted(range(n), key=lambda j: len(prefixes[j]))  # batches of alike lengths pad little
    for start in range(0, n, _BATCH):
        chunk = order[start : start + _BATCH]
        scores = teacher._item_scores([prefixes[j] for j in chunk]).double()
        probs = torch.softmax(scores, dim=-1)
        if not same:
            known = columns >= 0
            spread = probs.new_zeros(len(chunk), index.n_items)
            spread[:, columns[known]] = probs[:, known]
            probs = spread
        at = torch.tensor(chunk)
        out_codes[at], kept = trie_distributions(probs, wanted[at], codes, index.codes_per_level, top_k)
        out_probs[at] = kept.float()
        confidence[at] = probs.max(dim=1).values
    keep_confident(out_codes, out_probs, codes[wanted], confidence, confident_share)
    token_ids = level_token_ids(index, tokenizer)
    ids = torch.stack([token_ids[level][out_codes[:, level]] for level in range(levels)], dim=1).int()
    counts = torch.tensor([row.targets for row in rows], dtype=torch.long)
    return TeacherTargets(ids, out_probs, counts)


def add_teacher_columns(dataset, targets: TeacherTargets, rows: Sequence[Row], index, tokenizer):
    """``dataset`` (the rows of :func:`training_rows`, in order) with :data:`TEACHER_COLUMNS`, after checking
    that each row's labelled SID tokens are its targets' SIDs (sequence rows) or its target (prompt rows)."""
    import pyarrow as pa
    from datasets import Dataset, concatenate_datasets

    if len(targets.counts) != len(rows):
        raise ValueError(f"{len(targets.counts)} rows of teacher targets for {len(rows)} training rows")
    if len(dataset) != len(rows):
        raise ValueError(
            f"the training data has {len(dataset)} rows where the teacher's targets expect {len(rows)}: build "
            "them with training_dataset over the whole split (no users= filter)"
        )
    ends = targets.counts.cumsum(0).tolist()
    columns = set(dataset.column_names)
    if "completion_mask" in columns:
        token_ids = level_token_ids(index, tokenizer)
        codes = torch.as_tensor(index.codes, dtype=torch.long)
        sid_tokens = torch.stack([token_ids[lv][codes[:, lv]] for lv in range(index.n_levels)], dim=1)
        for r, (ids, mask) in enumerate(zip(dataset["input_ids"], dataset["completion_mask"], strict=True)):
            labelled = [t for t, m in zip(ids, mask, strict=True) if m]
            expected = sid_tokens[[index.row_of(i) for i in rows[r].items[rows[r].first :]]].flatten()
            if labelled != expected.tolist():
                raise ValueError(
                    f"training row {r} does not hold the SIDs of the targets the teacher scored: the rows of "
                    "training_dataset changed order or content; rebuild them with the same split, format and "
                    "augmentation"
                )
    elif "target" in columns:
        for r, target in enumerate(dataset["target"]):
            if rows[r].items[-1] != target or rows[r].targets != 1:
                raise ValueError(f"training row {r} predicts {target!r}, the teacher {rows[r].items[-1]!r}")
    else:
        raise ValueError("teacher targets go with training_dataset's rows (sequence or prompt objective)")
    levels, top_k = targets.ids.shape[1:]
    offsets = pa.array([0, *(e * levels for e in ends)], pa.int32())

    def column(values: torch.Tensor, kind) -> pa.Array:
        flat = pa.array(values.reshape(-1).numpy(), kind)
        return pa.ListArray.from_arrays(offsets, pa.FixedSizeListArray.from_arrays(flat, top_k))

    added = pa.table(
        {
            TEACHER_COLUMNS[0]: column(targets.ids, pa.int32()),
            TEACHER_COLUMNS[1]: column(targets.probs, pa.float32()),
        }
    )
    return concatenate_datasets([dataset, Dataset(added)], axis=1)


# ------------------------------------------------------------------------------------------------ the teacher


def fit_teacher(split, index, epochs: int, seed: int, *, show_progress: bool = False):
    """SASRec on ``split``'s training histories over ``index``'s items (validation picks its epoch);
    ``show_progress``: its epochs on stderr (validation Recall, time left)."""
    from ...sids.sasrec import SASRecConfig
    from ...sids.sasrec_cache import shared_fit

    unknown = sorted({i for u in split.users for i in (*u.history, u.valid) if i not in index})
    if unknown:
        raise ValueError(
            f"{len(unknown)} items of the training histories or validation targets have no SID (e.g. "
            f"{unknown[0]!r}): the teacher scores the index's items"
        )
    teacher = shared_fit(
        split, index.item_ids, SASRecConfig(max_epochs=epochs, seed=seed), show_progress=show_progress
    )
    best = teacher.history[teacher.best_epoch - 1] if teacher.best_epoch else {}
    logger.info(
        "distillation teacher: SASRec in %.0f s, best epoch %d of %d (validation NDCG@10 %.4f)",
        teacher.train_seconds,
        teacher.best_epoch,
        len(teacher.history),
        best.get("valid_ndcg@10", float("nan")),
    )
    return teacher


def _keys(
    split, index, tokenizer, fmt: PromptFormat, augment, top_k: int, epochs: int, seed: int, share: float
):
    from .. import runs

    teacher = runs.fingerprint(
        {
            "items": index.item_ids,
            "split": [[u.user_id, list(u.history), u.valid] for u in split.users],  # no test item
            "epochs": epochs,
            "seed": seed,
        }
    )
    token_ids = [t.tolist() for t in level_token_ids(index, tokenizer)]
    targets = runs.fingerprint(
        {
            "teacher": teacher,
            "index": index.fingerprint(),
            "token_ids": token_ids,
            "format": asdict(fmt),
            "augment": None if augment is None else asdict(augment),
            "top_k": top_k,
            "confident_share": share,
        }
    )
    return teacher, targets


def _read_record(folder: Path) -> dict | None:
    try:
        record = json.loads((folder / RECORD_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("format") == FORMAT else None


def _load_targets(folder: Path, record: dict | None, key: str) -> TeacherTargets | None:
    from safetensors.torch import load

    if record is None or record.get("targets_key") != key:
        return None
    try:
        blob = (folder / TARGETS_FILE).read_bytes()
    except OSError:
        return None
    if hashlib.sha256(blob).hexdigest() != record.get("targets_sha256"):
        return None
    tensors = load(blob)
    return TeacherTargets(tensors["ids"], tensors["probs"], tensors["counts"])


def _load_teacher(folder: Path, record: dict | None, key: str):
    from ...sids.sasrec import SASRecRecommender

    if record is None or record.get("teacher_key") != key:
        return None
    try:
        return SASRecRecommender.load(folder)
    except (OSError, ValueError):
        return None


def _save(folder: Path, teacher, targets: TeacherTargets, keys: tuple[str, str]) -> None:
    from safetensors.torch import save

    teacher.save(folder)
    blob = save(targets.tensors())
    atomic_write(folder / TARGETS_FILE, blob)
    record = {
        "format": FORMAT,
        "version": 1,
        "teacher_key": keys[0],
        "targets_key": keys[1],
        "targets_sha256": hashlib.sha256(blob).hexdigest(),
        "targets": int(targets.ids.shape[0]),
        "best_epoch": teacher.best_epoch,
    }
    atomic_write_text(folder / RECORD_FILE, json.dumps(record, indent=1) + "\n")


def _holds_a_run(output_dir: Path) -> bool:
    from .. import runs

    return bool(runs.checkpoints(output_dir)) or (output_dir / runs.ADAPTER_DIR).exists()


def with_teacher(
    build: Callable[[Any], Any],
    split,
    index,
    args,
    tokenizer,
    *,
    fmt: PromptFormat,
    augment=None,
):
    """``build(tokenizer)`` (the training rows) with the teacher's targets (``args``: a
    ``RecommendationConfig`` with ``distill_weight > 0``). The teacher and its targets come from
    ``<args.output_dir>/teacher/`` when it holds them for these inputs and settings; else SASRec is fitted
    (``distill_epochs``, seeded by ``args.seed``) and both are written there, unless that folder vouches for
    other targets of a run already under way there (then they are kept, and the run's manifest decides). The
    fit shows its epochs on stderr, as the training does (not with ``args.disable_tqdm``; the main process)."""
    from accelerate import PartialState

    dataset = build(tokenizer)
    rows = training_rows(split, fmt, augment)
    epochs, seed, top_k = args.distill_epochs, args.seed, args.distill_top_k
    share = args.distill_confident_share
    keys = _keys(split, index, tokenizer, fmt, augment, top_k, epochs, seed, share)
    output_dir = Path(args.output_dir) if args.output_dir else None
    folder = None if output_dir is None else output_dir / TEACHER_DIR
    with PartialState().main_process_first():  # the main process fits and writes; the others read
        record = None if folder is None else _read_record(folder)
        targets = None if folder is None else _load_targets(folder, record, keys[1])
        if targets is not None:
            logger.info("distillation: the teacher's %d soft targets from %s", len(targets.ids), folder)
        else:
            teacher = None if folder is None else _load_teacher(folder, record, keys[0])
            fitted = teacher is None
            show = not getattr(args, "disable_tqdm", False) and PartialState().is_local_main_process
            teacher = teacher or fit_teacher(split, index, epochs, seed, show_progress=show)
            targets = teacher_targets(teacher, rows, index, tokenizer, top_k, share)
            # never replace what vouches for another run's targets in its own folder
            writable = folder is not None and (record is None or not _holds_a_run(output_dir))
            if writable and PartialState().is_main_process:
                _save(folder, teacher, targets, keys)
            source = "a teacher fitted now" if fitted else f"the teacher saved in {folder}"
            logger.info("distillation: %d soft targets from %s", len(targets.ids), source)
    return add_teacher_columns(dataset, targets, rows, index, tokenizer)


# ------------------------------------------------------------------------------------------------ batches


class TeacherCollator:
    """TRL's collator, plus the teacher's columns: every row's ``[top_k]`` lists concatenated, in row order,
    into ``teacher_ids`` (long) and ``teacher_probs`` (float32) ``[N, top_k]``, ``N`` = the batch's labelled SID
    tokens (row-major: the order the compact head scores them, in padded and padding-free batches). A row
    whose labelled SID tokens (after its first token, which nothing predicts) are not as many as its lists
    (a row cut at ``max_length``) is refused. Batches without the columns pass through unchanged."""

    def __init__(self, collator: Callable, sid_ids: Iterable[int], top_k: int) -> None:
        self.collator = collator
        self.sid_ids = frozenset(int(i) for i in sid_ids)
        self.top_k = top_k

    def __getattr__(self, name: str):
        if name == "collator":  # not set yet (unpickling)
            raise AttributeError(name)
        return getattr(self.collator, name)

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        if not examples or TEACHER_COLUMNS[0] not in examples[0]:
            return self.collator(examples)
        ids: list[list[int]] = []
        probs: list[list[float]] = []
        for example in examples:
            labels = example.get("labels", example["input_ids"])
            wanted = sum(1 for token in labels[1:] if token in self.sid_ids)
            if len(example[TEACHER_COLUMNS[0]]) != wanted:
                raise ValueError(
                    f"a training row has {wanted} labelled SID tokens and {len(example[TEACHER_COLUMNS[0]])} "
                    "teacher targets: rows cut at max_length (allow_truncation) cannot be distilled; raise "
                    "max_length or show fewer history items"
                )
            ids += example[TEACHER_COLUMNS[0]]
            probs += example[TEACHER_COLUMNS[1]]
        batch = self.collator([{k: v for k, v in e.items() if k not in TEACHER_COLUMNS} for e in examples])
        batch[TEACHER_COLUMNS[0]] = torch.tensor(ids, dtype=torch.long).reshape(-1, self.top_k)
        batch[TEACHER_COLUMNS[1]] = torch.tensor(probs, dtype=torch.float32).reshape(-1, self.top_k)
        return batch


def soft_cross_entropy(probs: torch.Tensor, log_probs: torch.Tensor) -> torch.Tensor:
    """``-sum_k q_k log p_k`` per row of ``[N, top_k]`` teacher probabilities and student log-probabilities."""
    return -(probs.to(log_probs.dtype) * log_probs).sum(-1)


__all__ = [
    "TEACHER_COLUMNS",
    "Row",
    "TeacherCollator",
    "TeacherTargets",
    "add_teacher_columns",
    "fit_teacher",
    "keep_confident",
    "soft_cross_entropy",
    "teacher_targets",
    "training_rows",
    "trie_distributions",
    "with_teacher",
]
