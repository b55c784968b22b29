"""How a user's history becomes text: the prompt format shared by training, decoding and evaluation.

One :class:`PromptFormat` renders training rows and the inference prompts that constrained decoding
continues, so the two always agree; adapters record it (``GroundedTokenConfig.prompt_format``) and
evaluation reuses what was recorded.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."


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


def use_chat(tokenizer, chat: bool | None) -> bool:
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
    chat = use_chat(tokenizer, chat)
    users, prompts, targets = [], [], []
    for user, history, target in examples:
        prompt = fmt.prompt(history, index, catalogue, chat)
        if chat:
            prompt = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        users.append(user)
        prompts.append(prompt)
        targets.append(target)
    return users, prompts, targets
