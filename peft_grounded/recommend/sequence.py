"""The sequence objective's training rows: a user's training history as SIDs only, every item a target.

A history is cut into chunks of ``max_history + 1`` items that share one item at each boundary
(``h[0:L]``, ``h[L-1:2L-1]``, ...), so each training transition ``h[t-1] -> h[t]`` is a target exactly
once per epoch and no target sees more than ``max_history`` items, as at inference. A chunk is written
with :meth:`PromptFormat.sequence_text` and tokenised once; the loss mask (``completion_mask``, which TRL's
``SFTTrainer`` turns into labels) is 1 on the SID tokens of items 2..L and 0 on the start token, the
prefix, the first item, titles and separators. The inference prompt of a target is therefore the row's
token prefix up to that target's SID, token for token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ..prompts import HistoryError, PromptFormat
from .augmentation import Augmentation


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
