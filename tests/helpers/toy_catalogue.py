"""A small, deterministic catalogue with clustered item vectors, and its SID index (no encoder needed)."""

from __future__ import annotations

import numpy as np

from peft_grounded.sids import Catalogue, Item, build_sids

GENRES = ("comedy", "horror", "drama", "western")


def toy_catalogue(n_items: int = 16, n_users: int = 12, seed: int = 0) -> Catalogue:
    rng = np.random.default_rng(seed)
    items = {}
    for i in range(n_items):
        genre = GENRES[i % len(GENRES)]
        description = "" if i % 5 == 4 else f"A {genre} film about thing number {i}."
        items[str(i)] = Item(
            str(i),
            title=f"The {genre.capitalize()} Story {i}",
            description=description,
            categories=(genre.capitalize(),),
        )
    sequences = {}
    for u in range(n_users):
        genre = u % len(GENRES)
        pool = [i for i in range(n_items) if i % len(GENRES) == genre] + list(rng.choice(n_items, 2))
        length = 5 + u % 3
        sequences[f"u{u}"] = tuple(str(int(rng.choice(pool))) for _ in range(length))
    return Catalogue("toy", items, sequences)


def toy_vectors(catalogue: Catalogue, dim: int = 24, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(len(GENRES), dim)) * 3
    rows = []
    for item in catalogue.items.values():
        genre = GENRES.index(item.categories[0].lower())
        rows.append(centres[genre] + rng.normal(size=dim))
    return np.asarray(rows, dtype=np.float32)


def toy_index(catalogue: Catalogue, levels: int = 2, codes: int = 4, seed: int = 0):
    return build_sids(
        catalogue,
        vectors=toy_vectors(catalogue, seed=seed),
        levels=levels,
        codes=codes,
        encoder_fingerprint={"kind": "toy", "model": "clusters"},
        show_progress=False,
    )
