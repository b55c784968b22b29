"""Next-item examples: a user's history as SIDs (optionally with titles) -> the next item's SID.

:func:`training_dataset` builds the rows of either objective (``PromptFormat.objective``): ``"sequence"``
rows come from :mod:`.sequence`; ``"prompt"`` rows are described here. Prompt-objective examples are sliding windows over each user's training history (every position predicts the
next item from at most ``max_history`` previous ones); validation and test prompts use the whole
history up to the target. The same :class:`PromptFormat` renders training rows (TRL prompt-completion
format) and the inference prompts that constrained decoding continues, so the two always agree.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ..prompts import HistoryError, PromptFormat, use_chat
from .augmentation import Augmentation


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
    :mod:`.sequence`); ``augment`` adds altered copies of the histories (:mod:`.augmentation`)."""
    from datasets import Dataset

    fmt = fmt or PromptFormat()
    if fmt.objective == "sequence":
        from .sequence import sequence_dataset

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
