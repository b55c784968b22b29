"""A catalogue with a planted sequence: each item is always followed by the same successor."""

from __future__ import annotations

import random

from peft_grounded.sids.catalogue import Catalogue, Item

N_ITEMS = 30

# A SASRec small and fast enough for tests (seconds), yet one that learns the planted successor.
SMALL_SASREC = {
    "hidden_size": 32,
    "max_length": 8,
    "batch_size": 16,
    "learning_rate": 5e-3,
    "dropout": 0.1,
    "threads": 1,
}


def planted_catalogue(n_users: int = 80, seed: int = 0) -> Catalogue:
    """Items on one 30-item cycle (each followed by its successor); users start anywhere and read 5 to 12
    items, so no user meets an item twice."""
    rng = random.Random(seed)
    order = list(range(N_ITEMS))
    rng.shuffle(order)
    successor = {order[i]: order[(i + 1) % N_ITEMS] for i in range(N_ITEMS)}
    sequences = {}
    for u in range(n_users):
        item, seq = rng.randrange(N_ITEMS), []
        for _ in range(rng.randint(5, 12)):
            seq.append(str(item))
            item = successor[item]
        sequences[f"u{u}"] = tuple(seq)
    items = {str(i): Item(str(i), title=f"item {i}") for i in range(N_ITEMS)}
    return Catalogue("planted", items, sequences)
