"""Next-item examples: a user's history as SIDs (optionally with titles) -> the next item's SID.

:func:`training_dataset` builds the rows of either objective (``PromptFormat.objective``): ``"prompt"``
rows are sliding windows over each user's training history (every position predicts the next item from at
most ``max_history`` previous ones); validation and test prompts use the whole history up to the target.
``"sequence"`` rows (:func:`sequence_dataset`, below) predict every item of a window at once. The same
:class:`PromptFormat` renders training rows (TRL prompt-completion format) and the inference prompts that
constrained decoding continues, so the two always agree. :class:`Augmentation` makes altered copies of the
training histories against overfitting.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ...prompts import HistoryError, PromptFormat, use_chat


def recommendation_examples(
    examples: Iterable[tuple[str, Sequence[str], str]],
    index,
    catalogue=None,
    fmt: PromptFormat | None = None,
    chat: bool = True,
) -> list[dict]:
    """Rows ``{"user_id", "target", "prompt", "completion"}`` from ``(user, history, target)`` triples."""
    fmt = fmt or PromptFormat()
    rows = []
    for user, history, target in examples:
        if target not in index:
            raise HistoryError(
                f"Target item {target!r} of user {user!r} has no SID in the index: train on the catalogue the index "
                "was built from, or add the item to the index (peft-grounded add-items)."
            )
        sid = index.sid_text(target)
        completion: Any = [{"role": "assistant", "content": sid}] if chat else sid
        rows.append(
            {
                "user_id": user,
                "target": target,
                "prompt": fmt.prompt(history, index, catalogue, chat),
                "completion": completion,
            }
        )
    return rows


def training_dataset(
    split,
    index,
    catalogue=None,
    tokenizer=None,
    fmt: PromptFormat | None = None,
    chat: bool | None = None,
    users: Sequence[str] | None = None,
    augment: Augmentation | None = None,
):
    """The training rows of ``fmt.objective`` as a ``datasets.Dataset``: sliding-window prompt -> SID
    examples (``"prompt"``), or pre-tokenised SID chunks with a loss mask (``"sequence"``, see
    :mod:`.data`); ``augment`` adds altered copies of the histories (:mod:`.data`)."""
    from datasets import Dataset

    fmt = fmt or PromptFormat()
    if fmt.objective == "sequence":
        return sequence_dataset(split, index, tokenizer, catalogue, fmt, users, augment)
    chat = use_chat(tokenizer, chat)
    keep = None if users is None else set(users)
    triples = [t for t in split.train_examples(fmt.max_history) if keep is None or t[0] in keep]
    if not triples:
        raise HistoryError("No training example: every user's training history is a single item.")
    if augment is not None:
        views = augment.views([history for _, history, _ in triples], min_items=1)
        triples += [(user, view, target) for (user, _, target), view in zip(triples, views, strict=True)]
    return Dataset.from_list(recommendation_examples(triples, index, catalogue, fmt, chat))


# The sequence objective's training rows: a user's training history as SIDs only, every item a target.
#
# A history is cut into chunks of ``max_history + 1`` items that share one item at each boundary
# (``h[0:L]``, ``h[L-1:2L-1]``, ...), so each training transition ``h[t-1] -> h[t]`` is a target exactly
# once per epoch and no target sees more than ``max_history`` items, as at inference. A chunk is written
# with :meth:`PromptFormat.sequence_text` and tokenised once; the loss mask (``completion_mask``, which TRL's
# ``SFTTrainer`` turns into labels) is 1 on the SID tokens of items 2..L and 0 on the start token, the
# prefix, the first item, titles and separators. The inference prompt of a target is therefore the row's
# token prefix up to that target's SID, token for token.


def chunk_bounds(length: int, max_items: int | None) -> list[tuple[int, int]]:
    """``[start, stop)`` of the chunks of a history of ``length`` items (consecutive chunks share one item;
    a last chunk of a single item, which holds no target, is left out)."""
    if max_items is not None and max_items < 2:
        raise ValueError(f"A chunk needs at least 2 items (one target); got {max_items}.")
    step = (max_items or length) - 1
    bounds = []
    for start in range(0, max(length - 1, 0), max(step, 1)):
        bounds.append((start, min(start + (max_items or length), length)))
    return bounds


class SIDTokens:
    """The token ids of each item's SID under one tokenizer (cached), and the set of all SID token ids."""

    def __init__(self, index, tokenizer) -> None:
        self.index, self.tokenizer = index, tokenizer
        self.vocab = set(tokenizer.convert_tokens_to_ids(index.token_strings))
        self._ids: dict[str, list[int]] = {}

    def __call__(self, item_id: str) -> list[int]:
        if item_id not in self._ids:
            self._ids[item_id] = self.tokenizer(self.index.sid_text(item_id), add_special_tokens=False)[
                "input_ids"
            ]
        return self._ids[item_id]


def sequence_row(
    items: Sequence[str],
    index,
    tokenizer,
    catalogue=None,
    fmt: PromptFormat | None = None,
    sid_tokens: SIDTokens | None = None,
) -> dict:
    """``{"input_ids", "completion_mask"}`` of one chunk: mask 1 on the SID tokens of items 2..n."""
    fmt = fmt or PromptFormat(objective="sequence")
    sid_tokens = sid_tokens or SIDTokens(index, tokenizer)
    text = fmt.sequence_text(items, index, tokenizer, catalogue)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    sid_ids = [sid_tokens(i) for i in items]
    sid_vocab = sid_tokens.vocab
    mask = [0] * len(ids)
    runs: list[list[int]] = []  # positions of each maximal run of SID tokens
    for pos, token in enumerate(ids):
        if token in sid_vocab:
            if runs and runs[-1][-1] == pos - 1:
                runs[-1].append(pos)
            else:
                runs.append([pos])
    found = [[ids[p] for p in run] for run in runs]
    if found != sid_ids:
        raise HistoryError(
            f"The chunk's text does not tokenise into its items' SIDs ({len(found)} SID runs for {len(items)} "
            "items): add the SID tokens to the tokenizer (peft_grounded.add_tokens) and keep SID-like text "
            "out of the titles, prefix and separator."
        )
    for run in runs[1:]:
        for pos in run:
            mask[pos] = 1
    return {"input_ids": ids, "completion_mask": mask}


def sequence_rows(
    split,
    index,
    tokenizer,
    catalogue=None,
    fmt: PromptFormat | None = None,
    users: Sequence[str] | None = None,
    augment: Augmentation | None = None,
) -> list[dict]:
    """One row per chunk of every user's training history (see the module docstring), then ``augment``'s
    altered copies of the chunks."""
    if tokenizer is None:
        raise ValueError(
            "The sequence objective tokenises its rows: pass the tokenizer (with the SID tokens)."
        )
    fmt = fmt or PromptFormat(objective="sequence")
    fmt = replace(fmt, start=fmt.start_token(tokenizer))  # resolved once, not per chunk
    keep = None if users is None else set(users)
    max_items = fmt.max_history + 1 if fmt.max_history else None
    chunks = [
        user.history[start:stop]
        for user in split.users
        if keep is None or user.user_id in keep
        for start, stop in chunk_bounds(len(user.history), max_items)
    ]
    if augment is not None:
        chunks += augment.views(chunks, min_items=2)
    sid_tokens = SIDTokens(index, tokenizer)
    rows = [sequence_row(chunk, index, tokenizer, catalogue, fmt, sid_tokens) for chunk in chunks]
    if not rows:
        raise HistoryError("No training chunk: every user's training history is a single item.")
    return rows


def sequence_dataset(*args, **kwargs):
    """:func:`sequence_rows` (same arguments) as a ``datasets.Dataset`` (pre-tokenised: TRL builds the labels
    from the mask)."""
    from datasets import Dataset

    return Dataset.from_list(sequence_rows(*args, **kwargs))


# Altered copies of training histories against overfitting: items dropped at random, as CL4SRec's crops
# and masks alter a sequence, so that later epochs see histories they have not seen before.


@dataclass(frozen=True)
class Augmentation:
    """``copies`` altered copies of each history, each dropping every item with probability ``drop``
    (``seed``: the same copies on every build, so a resumed run trains on the same data)."""

    copies: int
    drop: float
    seed: int = 0

    @classmethod
    def of(cls, args) -> Augmentation | None:
        """The augmentation a ``RecommendationConfig`` asks for (None without ``augment_views``)."""
        views = getattr(args, "augment_views", 0)
        return cls(views, args.augment_drop, args.seed) if views else None

    def views(self, histories: Sequence[Sequence[str]], min_items: int) -> list[tuple[str, ...]]:
        """``self.copies`` altered copies of every history (all first copies, then all second ones), each keeping at
        least ``min_items`` items in their order; a history of ``min_items`` or fewer is copied as it is."""
        rng = random.Random(self.seed)
        out = []
        for _ in range(self.copies):
            for history in histories:
                keep = [i for i in range(len(history)) if rng.random() >= self.drop]
                if len(keep) < min_items:
                    keep = sorted(rng.sample(range(len(history)), min(min_items, len(history))))
                out.append(tuple(history[i] for i in keep))
        return out
