"""Names of Semantic-ID tokens: one token per (level, code), e.g. ``<a_12>`` for code 12 at level 0."""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from typing import Any

DEFAULT_TEMPLATE = "<{level}_{code}>"


def level_name(level: int) -> str:
    """Letter of a level: 0 -> 'a', 1 -> 'b', ..., 25 -> 'z', 26 -> 'aa'."""
    if level < 0:
        raise ValueError(f"level must be >= 0, got {level}")
    letters = string.ascii_lowercase
    name = ""
    level += 1
    while level:
        level, rem = divmod(level - 1, 26)
        name = letters[rem] + name
    return name


def level_index(name: str) -> int:
    """Inverse of :func:`level_name`: 'a' -> 0, 'z' -> 25, 'aa' -> 26."""
    if not name or not all("a" <= c <= "z" for c in name):
        raise ValueError(f"a level name is lowercase letters, got {name!r}")
    level = 0
    for letter in name:
        level = level * 26 + (ord(letter) - ord("a") + 1)
    return level - 1


def sid_token(level: int, code: int, template: str = DEFAULT_TEMPLATE) -> str:
    """The token string of ``code`` at ``level`` (``template`` may use ``{level}``, ``{level_index}``, ``{code}``)."""
    return template.format(level=level_name(level), level_index=level, code=code)


def sid_vocabulary(codes_per_level: Sequence[int], template: str = DEFAULT_TEMPLATE) -> list[str]:
    """All SID token strings, level by level, code by code (the order the adapter's rows follow)."""
    tokens = [
        sid_token(level, code, template) for level, n in enumerate(codes_per_level) for code in range(n)
    ]
    if len(set(tokens)) != len(tokens):
        raise ValueError(f"template {template!r} gives the same string to different (level, code) pairs")
    return tokens


def sid_string(codes: Sequence[int], template: str = DEFAULT_TEMPLATE) -> str:
    """The text of one item's SID, e.g. ``<a_12><b_3><c_200>``."""
    return "".join(sid_token(level, code, template) for level, code in enumerate(codes))


def parse_sid(text: str, template: str = DEFAULT_TEMPLATE) -> list[int]:
    """Inverse of :func:`sid_string` for the default-style templates; raises ``ValueError`` on malformed text."""
    pattern = (
        re.escape(template)
        .replace(r"\{level\}", r"(?P<level>[a-z]+)")
        .replace(r"\{code\}", r"(?P<code>\d+)")
        .replace(r"\{level_index\}", r"(?P<level_index>\d+)")
    )
    codes: list[int] = []
    pos = 0
    regex = re.compile(pattern)
    while pos < len(text):
        match = regex.match(text, pos)
        if match is None:
            raise ValueError(f"{text!r} is not a SID in the template {template!r} (at position {pos})")
        expected = level_name(len(codes))
        if "level" in match.groupdict() and match.group("level") != expected:
            raise ValueError(f"{text!r}: level {match.group('level')!r} where {expected!r} was expected")
        codes.append(int(match.group("code")))
        pos = match.end()
    return codes


def add_sid_tokens(
    tokenizer, model, codes_per_level: Sequence[int], template: str = DEFAULT_TEMPLATE, **kwargs
) -> Any:
    """Add one token per (level, code), named by ``template`` (default ``<a_12>``), level by level, with
    :func:`peft_grounded.adapter.add_tokens` (its ``AddedTokens``)."""
    from ..adapter.vocab import add_tokens

    return add_tokens(tokenizer, model, sid_vocabulary(codes_per_level, template), **kwargs)
