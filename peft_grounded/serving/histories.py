"""Users' histories as the recommender takes them: checked against the SID index, read from JSONL.

A histories file holds one JSON object per line, ``{"user": "u1", "history": ["item", ...]}`` (items oldest
first); the same file, with each user's newest interaction last, fits the new-item rule
(``--interactions``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class HistoryInputError(ValueError):
    """A history the recommender cannot serve; the message names the users, the items and the fix."""


@dataclass
class CheckedHistories:
    """Histories with the items the index lacks removed (``skip_unknown=True``), and what was removed."""

    histories: list[list[str]]
    unknown: list[list[str]]

    @property
    def skipped(self) -> int:
        return sum(len(u) for u in self.unknown)


def check_histories(
    histories: Sequence[Sequence[Any]],
    index: Any,
    *,
    skip_unknown: bool = False,
    users: Sequence[str] | None = None,
) -> CheckedHistories:
    """Refuse empty histories, and items the index does not hold (named) unless ``skip_unknown``, which
    drops them and counts them; a history of only unknown items is refused either way."""
    if isinstance(histories, (str, bytes)) or (histories and isinstance(histories[0], (str, bytes, int))):
        raise HistoryInputError(
            "histories is a list of histories (one list of item ids per user); for one user pass [history]"
        )
    names = check_user_names(users, len(histories))
    kept, unknown = [], []
    for name, history in zip(names, histories, strict=True):
        if isinstance(history, (str, bytes)) or not isinstance(history, (list, tuple)):
            raise HistoryInputError(
                f"user {name}: the history is {_short(history)}, not a list of item ids; give [ITEM, ...]"
            )
        bad = [i for i in history if not is_item_id(i)]
        if bad:
            raise HistoryInputError(
                f"user {name}: history entries {[_short(b) for b in bad[:3]]} are not item ids (strings or "
                "integers); give each item's id"
            )
        items = [str(i) for i in history]
        if not items:
            raise HistoryInputError(
                f"user {name} has an empty history: the model recommends from what a user did; leave such users "
                "out (a popularity list is the usual answer for them)"
            )
        missing = [i for i in items if i not in index]
        if missing and not skip_unknown:
            raise HistoryInputError(
                f"user {name}: items {missing[:5]} are not in the SID index ({index.n_items} items); check the ids, "
                "add new items with `peft-grounded add-items` + `grow-adapter`, or skip unknown items "
                "(skip_unknown=True, --skip_unknown)"
            )
        if len(missing) == len(items):
            raise HistoryInputError(
                f"user {name}: none of the {len(items)} history items is in the SID index (e.g. {missing[:3]}); "
                "with nothing known there is nothing to recommend from: check that the ids are this catalogue's"
            )
        kept.append([i for i in items if i in index])
        unknown.append(missing)
    return CheckedHistories(kept, unknown)


def is_item_id(value: Any) -> bool:
    """Item and user ids are strings or integers (JSON's ``true``, ``null``, lists and objects are not)."""
    return not isinstance(value, bool) and isinstance(value, (str, int)) and str(value).strip() != ""


def check_user_names(users: Sequence[Any] | None, n: int) -> list[str]:
    """``users`` as strings (default ``#0``, ``#1``, ...): one per history, each an id, none twice."""
    if users is None:
        return [f"#{u}" for u in range(n)]
    if isinstance(users, (str, bytes)):
        raise HistoryInputError(f"users={users!r} is one string: give one name per history, in a list")
    users = list(users)
    if len(users) != n:
        raise HistoryInputError(f"{len(users)} user names for {n} histories: give one per history")
    bad = [u for u in users if not is_item_id(u)]
    if bad:
        raise HistoryInputError(
            f"user names {[_short(b) for b in bad[:3]]} are not ids (strings or integers)"
        )
    names = [str(u) for u in users]
    twice = sorted({u for u in names if names.count(u) > 1})
    if twice:
        raise HistoryInputError(f"users {twice[:5]} appear more than once: give one history per user")
    return names


def _short(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (dict, list, bool, type(None))) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def parse_history(text: str) -> list[str]:
    """``"1,2,3"`` -> ``["1", "2", "3"]`` (the command line's ``--history``); an empty or blank item is
    refused, naming its place."""
    parts = [part.strip() for part in text.split(",")]
    if not any(parts):
        raise HistoryInputError(
            "--history is empty: give the user's item ids, oldest first, comma-separated (e.g. --history 1,50,181)"
        )
    blank = [n for n, part in enumerate(parts, 1) if not part]
    if blank:
        raise HistoryInputError(
            f"--history {text!r} has an empty item at place {blank[0]}: give item ids separated by single commas"
        )
    return parts


def read_histories(path: str | Path) -> tuple[list[str], list[list[str]]]:
    """``(users, histories)`` from a JSONL file of ``{"user": ..., "history": [...]}`` lines."""
    path = Path(path)
    if not path.is_file():
        what = "a folder" if path.is_dir() else "not there"
        raise HistoryInputError(f"{path} is {what}: give a JSONL file of users")
    users, histories, seen = [], [], set()
    try:  # utf-8-sig: a byte-order mark (as some Windows editors write) is not part of the first line
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as err:
        raise HistoryInputError(
            f"{path} is not UTF-8 text ({err.reason} at byte {err.start}); write JSONL"
        ) from None
    # lines end at "\n" only: str.splitlines() would also break a JSON string holding U+2028 or U+0085
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        where = f"{path}, line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise HistoryInputError(
                f"{where} is not JSON ({err.msg}); write one JSON object per line"
            ) from None
        if not isinstance(record, dict) or not {"user", "history"} <= set(record):
            got = (
                f"fields {sorted(record)}" if isinstance(record, dict) else f"a JSON {type(record).__name__}"
            )
            raise HistoryInputError(f'{where}: expected {{"user": ID, "history": [ITEM, ...]}}, got {got}')
        if not is_item_id(record["user"]):
            raise HistoryInputError(
                f'{where}: "user" is {_short(record["user"])}; a user id is a string or an integer'
            )
        history = record["history"]
        if not isinstance(history, list):
            raise HistoryInputError(f'{where}: "history" is {_short(history)}, not a list of item ids')
        bad = [i for i in history if not is_item_id(i)]
        if bad:
            raise HistoryInputError(
                f'{where}: "history" holds {[_short(b) for b in bad[:3]]}; item ids are strings or integers'
            )
        user = str(record["user"])
        if user in seen:
            raise HistoryInputError(f"{where}: user {user!r} appears twice; give one line per user")
        seen.add(user)
        users.append(user)
        histories.append([str(i) for i in history])
    if not users:
        raise HistoryInputError(f"{path} holds no users; write one JSON line per user")
    return users, histories
