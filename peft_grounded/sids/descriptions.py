"""One text per SID token, for the adapter's ``init="description"`` start."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .index import SIDIndex


def token_descriptions(index: SIDIndex, titles: Any, per_token: int = 3, separator: str = "; ") -> list[str]:
    """One text per SID token (row order): the titles of its ``per_token`` most popular items, for the
    adapter's ``init="description"`` (``init_texts``). ``titles``: a ``Catalogue`` or ``{item_id:
    title}``. Popularity is the build catalogue's interaction count (ties: index order); a token no
    item carries gets ``""``."""
    if hasattr(titles, "items") and not isinstance(titles, Mapping):
        titles = {i: item.title for i, item in titles.items.items()}
    popularity = index.item_interactions if index.item_interactions is not None else np.zeros(index.n_items)
    out: list[str] = []
    for level, k in enumerate(index.codes_per_level):
        order = np.lexsort((np.arange(index.n_items), -popularity, index.codes[:, level]))
        column = index.codes[order, level]
        starts = np.searchsorted(column, np.arange(k), "left")
        ends = np.searchsorted(column, np.arange(k), "right")
        for lo, hi in zip(starts, ends, strict=True):
            names = [titles.get(index.item_ids[i], "") for i in order[lo : min(hi, lo + per_token)]]
            out.append(separator.join(n for n in names if n))
    return out
