"""A shop whose users buy within two groups of items while the items' text groups them otherwise: behaviour
and text disagree, so what item vectors hold is visible."""

from __future__ import annotations

import numpy as np

from peft_grounded.sids.catalogue import Catalogue, Item

TEXT_DIM = 12


def shop_catalogue(n_users: int = 80, seed: int = 0) -> tuple[Catalogue, np.ndarray]:
    """40 items; users buy within group A (items 0-19) or group B (20-39), while the text vectors group
    the items by parity, which behaviour never follows. Items 40 and 41 are never bought."""
    rng = np.random.default_rng(seed)
    ids = [f"i{k}" for k in range(42)]
    items = {i: Item(i, title=f"item {i}") for i in ids}
    sequences = {}
    for u in range(n_users):
        group = range(0, 20) if u % 2 == 0 else range(20, 40)
        sequences[f"u{u}"] = tuple(f"i{k}" for k in rng.choice(list(group), size=8, replace=False))
    parity = np.array([k % 2 for k in range(42)], dtype=np.float32)
    text = rng.normal(0, 0.05, (42, TEXT_DIM)).astype(np.float32)
    text[:, 0] += parity
    text[:, 1] += 1 - parity
    text[41] = text[40]  # two never-bought items with the same text
    return Catalogue("shop", items, sequences), text
