"""The new-item protocol's data side: which items are new (the newest by first interaction), the users
scored on them, their whole histories, and the pairs a serving side has logged since training (for
calibration).

``benchmarks/bench_grow_protocol.py`` runs the protocol (hold out the newest items, train on the rest, grow,
score the users whose target is new); these functions decide what it holds out and scores, and
:mod:`.controls` what the served rule is compared with, so they live with the rule (this package) and are
tested without a model (``tests/test_new_items_protocol.py``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..sids.catalogue import LeaveOneOut

Example = tuple[str, tuple[str, ...], str]  # (user id, history, target), as LeaveOneOut gives them


def first_seen(catalogue: Any, dataset: str | Path) -> dict[str, float]:
    """Per item of ``catalogue``, the time of its first interaction: the RecBole timestamps of the first
    ``*.inter`` file in ``dataset`` (a folder; ``"movielens-100k"`` is the packaged MovieLens-100K) when it
    has a ``timestamp`` column, else a position proxy (the earliest relative position in a user's
    sequence). An item never seen gets ``inf``."""
    if str(dataset) == "movielens-100k":
        from .. import assets

        directory = assets.movielens_100k()
    else:
        directory = Path(dataset)
    inter = sorted(directory.glob("*.inter")) if directory.is_dir() else []
    if inter:
        stamps = _recbole_first_stamps(inter[0])
        if stamps is not None:
            return {i: stamps.get(i, math.inf) for i in catalogue.items}
    return position_first_seen(catalogue.items, catalogue.sequences.values())


def _recbole_first_stamps(path: Path) -> dict[str, float] | None:
    """Item id -> earliest timestamp of a RecBole ``.inter`` file; None where it has no timestamp column."""
    lines = path.read_text().splitlines()
    if not lines:
        raise ValueError(
            f"{path} is empty: a RecBole .inter file starts with a header line (item_id:token ...)"
        )
    header = [h.split(":")[0] for h in lines[0].split("\t")]
    if "timestamp" not in header:
        return None
    if "item_id" not in header:
        raise ValueError(
            f"{path} has no item_id column (header: {lines[0]!r}); RecBole files name it item_id"
        )
    i_item, i_time = header.index("item_id"), header.index("timestamp")
    seen: dict[str, float] = {}
    for number, line in enumerate(lines[1:], start=2):
        cells = line.split("\t")
        if len(cells) <= max(i_item, i_time):
            raise ValueError(f"{path}, line {number}: {len(cells)} cells, the header has {len(header)}")
        item, stamp = cells[i_item], float(cells[i_time])
        seen[item] = min(seen.get(item, math.inf), stamp)
    return seen


def position_first_seen(items: Iterable[str], sequences: Iterable[tuple[str, ...]]) -> dict[str, float]:
    """Per item, the earliest relative position (0 first, below 1) at which any sequence holds it."""
    seen: dict[str, float] = {}
    for seq in sequences:
        for pos, item in enumerate(seq):
            seen[item] = min(seen.get(item, math.inf), pos / max(len(seq), 1))
    return {i: seen.get(i, math.inf) for i in items}


def new_item_examples(split: LeaveOneOut, new: set[str], max_history: int, positions: str) -> list[Example]:
    """One scored example per user whose target is a new item: its test target (``positions="test"``),
    or, with ``"last-two"``, the test target when new, else the validation target when new (the history
    before it). No model trains on either position, so both are fair for the retrained reference too."""
    _check_positions(positions)
    chosen = {e[0]: e for e in split.test_examples(max_history) if e[2] in new}
    if positions == "last-two":
        for e in split.valid_examples(max_history):
            if e[2] in new and e[0] not in chosen:
                chosen[e[0]] = e
    return [chosen[u.user_id] for u in split.users if u.user_id in chosen]


def logged_pairs(split: LeaveOneOut, positions: str) -> list[tuple[tuple[str, ...], str]]:
    """``(history, next item)`` at the position before the scored one, for every user: what the serving
    side has logged since the model trained (what :meth:`~.rule.NewItemRule.fit` calibrates on), never a
    scored target."""
    _check_positions(positions)
    if positions == "test":
        return [(u.history, u.valid) for u in split.users]
    return [(u.history[:-1], u.history[-1]) for u in split.users if len(u.history) > 1]


def full_histories(split: LeaveOneOut, examples: list[Example]) -> list[tuple[str, ...]]:
    """Each example's whole history before its target (the prompt shows only its last ``max_history``
    items): what the served route leaves out of the user's list and the new-item rule reads."""
    by_user = {u.user_id: u for u in split.users}
    out = []
    for user, _, target in examples:
        u = by_user[user]
        out.append(u.history if target == u.valid and target != u.test else (*u.history, u.valid))
    return out


def _check_positions(positions: str) -> None:
    if positions not in ("test", "last-two"):
        raise ValueError(f"positions={positions!r}: give 'test' or 'last-two'")
