"""Next-item examples: a user's history as SIDs (optionally with titles) -> the next item's SID.

Training examples are sliding windows over each user's training history (every position predicts the
next item from at most ``max_history`` previous ones); validation and test prompts use the whole
history up to the target. The same :class:`PromptFormat` renders training rows (TRL prompt-completion
format) and the inference prompts that constrained decoding continues, so the two always agree.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..grounding.data import DEFAULT_SYSTEM_PROMPT


class HistoryError(ValueError):
    """A history or target that cannot be turned into an example."""


@dataclass(frozen=True)
class PromptFormat:
    """How a history becomes a prompt."""

    max_history: int = 10
    with_titles: bool = False
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT
    instruction: str = "A user interacted with these items, oldest first: {history}. Which item comes next?"
    max_title_chars: int = 60

    def history_text(self, history: Sequence[str], index, catalogue=None) -> str:
        missing = [i for i in history if i not in index]
        if missing:
            raise HistoryError(
                f"History items {missing[:5]} have no SID in the index; rebuild the index on this catalogue "
                "(build_sids) or drop those items from the interactions."
            )
        parts = []
        for item_id in history[-self.max_history :] if self.max_history else history:
            sid = index.sid_text(item_id)
            if self.with_titles and catalogue is not None and item_id in catalogue.items:
                title = catalogue.items[item_id].title[: self.max_title_chars]
                parts.append(f'{sid} "{title}"' if title else sid)
            else:
                parts.append(sid)
        return ", ".join(parts)

    def prompt(self, history: Sequence[str], index, catalogue=None, chat: bool = True) -> Any:
        """The prompt of one example: chat messages, or a plain string ending where the SID starts."""
        if not history:
            raise HistoryError("An empty history cannot be turned into a prompt; drop users without history.")
        text = self.instruction.format(history=self.history_text(history, index, catalogue))
        if chat:
            system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
            return [*system, {"role": "user", "content": text}]
        return f"{text}\nAnswer:"


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
            raise HistoryError(f"Target item {target!r} of user {user!r} has no SID in the index.")
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
):
    """Sliding-window next-item examples of the training histories as a ``datasets.Dataset``."""
    from datasets import Dataset

    fmt = fmt or PromptFormat()
    chat = _use_chat(tokenizer, chat)
    keep = None if users is None else set(users)
    triples = [t for t in split.train_examples(fmt.max_history) if keep is None or t[0] in keep]
    if not triples:
        raise HistoryError("No training example: every user's training history is a single item.")
    return Dataset.from_list(recommendation_examples(triples, index, catalogue, fmt, chat))


def _use_chat(tokenizer, chat: bool | None) -> bool:
    if chat is None:
        return tokenizer is not None and getattr(tokenizer, "chat_template", None) is not None
    return chat


def inference_prompts(
    examples: Iterable[tuple[str, Sequence[str], str]],
    index,
    tokenizer,
    catalogue=None,
    fmt: PromptFormat | None = None,
    chat: bool | None = None,
) -> tuple[list[str], list[str], list[str]]:
    """``(users, prompt strings, targets)`` for decoding: each prompt ends exactly where the SID starts."""
    fmt = fmt or PromptFormat()
    chat = _use_chat(tokenizer, chat)
    users, prompts, targets = [], [], []
    for user, history, target in examples:
        prompt = fmt.prompt(history, index, catalogue, chat)
        if chat:
            prompt = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        users.append(user)
        prompts.append(prompt)
        targets.append(target)
    return users, prompts, targets
