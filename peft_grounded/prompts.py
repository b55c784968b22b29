"""How a user's history becomes text: the prompt format shared by training, decoding and evaluation.

One :class:`PromptFormat` renders training rows and the inference prompts that constrained decoding
continues, so the two always agree; adapters record it (``GroundedTokenConfig.prompt_format``) and
evaluation reuses what was recorded.

Two objectives:

* ``"prompt"`` (the papers' setting): a chat prompt (system prompt, an instruction naming the history)
  -> the next item's SID as the completion; one target per row.
* ``"sequence"``: the history written as SIDs only, ``<start>[prefix]<sid_1><sep><sid_2><sep>...``, every
  item after the first a target (each position predicts the next item, as SASRec-style decoders train).
  The inference prompt is the same layout ending with the separator, where the next SID starts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."
OBJECTIVES = ("prompt", "sequence")
DOCUMENT_SEPARATOR = "<|endoftext|>"  # the pretraining document boundary of GPT-2-style tokenizers


class HistoryError(ValueError):
    """A history or target that cannot be turned into an example."""


@dataclass(frozen=True)
class PromptFormat:
    """How a history becomes a prompt (``objective="prompt"``) or a SID sequence (``"sequence"``).

    Args:
        objective: ``"prompt"`` (instruction prompt -> one SID) or ``"sequence"`` (SIDs only, every item a
            target).
        max_history: items of history shown (0/None: all). For ``"sequence"``, training chunks hold
            ``max_history + 1`` items, so every target sees at most ``max_history`` items, as at inference.
        with_titles: write each history item's title after its SID.
        system_prompt, instruction: the chat prompt of the ``"prompt"`` objective (``instruction`` must
            contain ``{history}``).
        separator: text between items of a ``"sequence"`` (one token; it never merges with the SID tokens,
            which are added tokens).
        prefix: an optional short instruction written after the start token of a ``"sequence"``.
        start: the start token of a ``"sequence"``; None: the tokenizer's ``<|endoftext|>`` when it has
            one (GPT-2, SmolLM, Qwen: their pretraining document boundary), else its BOS token.
    """

    max_history: int | None = 10
    with_titles: bool = False
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT
    instruction: str = "A user interacted with these items, oldest first: {history}. Which item comes next?"
    max_title_chars: int = 60
    objective: str = "prompt"
    separator: str = " "
    prefix: str = ""
    start: str | None = None

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective={self.objective!r}: choose one of {', '.join(OBJECTIVES)}.")
        if "{history}" not in self.instruction:
            raise ValueError(
                f"PromptFormat.instruction {self.instruction!r} has no '{{history}}' placeholder, so the "
                "prompt would not show the user's history; add '{history}' where the items go."
            )
        if self.objective == "sequence" and (not self.separator or "<" in self.separator):
            raise ValueError(
                f"separator={self.separator!r}: a sequence needs a non-empty separator without '<' "
                "(it must not look like a SID token); the default is one space."
            )
        if self.max_history is not None and self.max_history < 0:
            raise ValueError(f"max_history={self.max_history} must be >= 0 (0 or None: the whole history).")

    @classmethod
    def from_record(cls, record: Any, source: str = "the adapter config") -> PromptFormat:
        """The format recorded as a dict (``asdict`` of one) in ``source``; a clear error naming ``source``
        for a record that is not a dict, has keys this version does not know, or values out of range."""
        from dataclasses import fields

        if not isinstance(record, dict):
            raise ValueError(
                f"{source}: prompt_format must be a JSON object of PromptFormat fields, got {type(record).__name__}"
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(record) - known)
        if unknown:
            raise ValueError(
                f"{source}: prompt_format has keys this peft_grounded does not know: {unknown} (known: "
                f"{sorted(known)}); it was written by another version: upgrade peft_grounded, or remove those keys"
            )
        try:
            return cls(**record)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{source}: its prompt_format cannot be used: {err}") from None

    def _check(self, history: Sequence[str], index) -> None:
        missing = [i for i in history if i not in index]
        if missing:
            raise HistoryError(
                f"History items {missing[:5]} have no SID in the index; rebuild the index on this catalogue "
                "(build_sids) or drop those items from the interactions."
            )

    def recent(self, history: Sequence[str]) -> Sequence[str]:
        """The items shown: the last ``max_history`` (all when it is 0 or None)."""
        return history[-self.max_history :] if self.max_history else history

    def item_text(self, item_id: str, index, catalogue=None) -> str:
        """One item as text: its SID, then its title in quotes when ``with_titles``."""
        sid = index.sid_text(item_id)
        if self.with_titles and catalogue is not None and item_id in catalogue.items:
            title = catalogue.items[item_id].title[: self.max_title_chars]
            return f'{sid} "{title}"' if title else sid
        return sid

    def history_text(self, history: Sequence[str], index, catalogue=None) -> str:
        self._check(history, index)
        return ", ".join(self.item_text(i, index, catalogue) for i in self.recent(history))

    def start_token(self, tokenizer) -> str:
        """The text a sequence starts with (see ``start``)."""
        if self.start is not None:
            return self.start
        if tokenizer is not None:
            token_id = tokenizer.convert_tokens_to_ids(DOCUMENT_SEPARATOR)  # not get_vocab(): a dict per call
            if token_id is not None and tokenizer.convert_ids_to_tokens(token_id) == DOCUMENT_SEPARATOR:
                return DOCUMENT_SEPARATOR
        token = getattr(tokenizer, "bos_token", None) or getattr(tokenizer, "eos_token", None)
        if token is None:
            raise ValueError(
                "The tokenizer has neither <|endoftext|> nor a BOS/EOS token: set PromptFormat(start=...)."
            )
        return token

    def sequence_text(self, items: Sequence[str], index, tokenizer, catalogue=None) -> str:
        """``<start>[prefix]<item 1><sep>...<item n><sep>``: a training chunk, or an inference prompt that
        ends where the next SID starts."""
        self._check(items, index)
        body = "".join(self.item_text(i, index, catalogue) + self.separator for i in items)
        return self.start_token(tokenizer) + self.prefix + body

    def prompt(self, history: Sequence[str], index, catalogue=None, chat: bool = True) -> Any:
        """The prompt of one ``"prompt"``-objective example: chat messages, or a plain string ending where
        the SID starts."""
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
    """``(users, prompt strings, targets)`` for decoding: each prompt ends exactly where the SID starts.

    For the ``"sequence"`` objective the prompt is the training layout of the (last ``max_history``) items,
    ending with the separator; ``chat`` is ignored there.
    """
    fmt = fmt or PromptFormat()
    chat = use_chat(tokenizer, chat)
    if fmt.objective == "sequence":
        fmt = replace(fmt, start=fmt.start_token(tokenizer))  # resolved once
    users, prompts, targets = [], [], []
    for user, history, target in examples:
        if fmt.objective == "sequence":
            if not history:
                raise HistoryError(f"User {user!r} has an empty history: drop users without history.")
            prompt = fmt.sequence_text(fmt.recent(history), index, tokenizer, catalogue)
        else:
            prompt = fmt.prompt(history, index, catalogue, chat)
            if chat:
                prompt = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        users.append(user)
        prompts.append(prompt)
        targets.append(target)
    return users, prompts, targets
