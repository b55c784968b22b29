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
    if isinstance(histories, (str, bytes)) or (histories and isinstance(histories[0], (str, bytes))):
        raise HistoryInputError(
            "histories is a list of histories (one list of item ids per user); for one user pass [history]"
        )
    names = list(users) if users is not None else [f"#{u}" for u in range(len(histories))]
    kept, unknown = [], []
    for name, history in zip(names, histories, strict=True):
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


def parse_history(text: str) -> list[str]:
    """``"1,2,3"`` -> ``["1", "2", "3"]`` (the command line's ``--history``)."""
    return [part.strip() for part in text.split(",") if part.strip()]


def read_histories(path: str | Path) -> tuple[list[str], list[list[str]]]:
    """``(users, histories)`` from a JSONL file of ``{"user": ..., "history": [...]}`` lines."""
    path = Path(path)
    users, histories, seen = [], [], set()
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            where = f"{path}, line {number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise HistoryInputError(
                    f"{where} is not JSON ({err.msg}); write one JSON object per line"
                ) from None
            if (
                not isinstance(record, dict)
                or "user" not in record
                or not isinstance(record.get("history"), list)
            ):
                raise HistoryInputError(
                    f'{where}: expected {{"user": ID, "history": [ITEM, ...]}}, got {line.strip()[:80]}'
                )
            user = str(record["user"])
            if user in seen:
                raise HistoryInputError(f"{where}: user {user!r} appears twice; give one line per user")
            seen.add(user)
            users.append(user)
            histories.append([str(i) for i in record["history"]])
    if not users:
        raise HistoryInputError(f"{path} holds no users; write one JSON line per user")
    return users, histories
