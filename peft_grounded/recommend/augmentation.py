"""Altered copies of training histories against overfitting: items dropped at random, as CL4SRec's crops
and masks alter a sequence, so that later epochs see histories they have not seen before."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Augmentation:
    """``copies`` altered copies of each history, each dropping every item with probability ``drop``
    (``seed``: the same copies on every build, so a resumed run trains on the same data)."""

    copies: int
    drop: float
    seed: int = 0

    @classmethod
    def of(cls, args) -> Augmentation | None:
        """The augmentation a ``RecommendationConfig`` asks for (None without ``augment_views``)."""
        views = getattr(args, "augment_views", 0)
        return cls(views, args.augment_drop, args.seed) if views else None

    def views(self, histories: Sequence[Sequence[str]], min_items: int) -> list[tuple[str, ...]]:
        """``self.copies`` altered copies of every history (all first copies, then all second ones), each keeping at
        least ``min_items`` items in their order; a history of ``min_items`` or fewer is copied as it is."""
        rng = random.Random(self.seed)
        out = []
        for _ in range(self.copies):
            for history in histories:
                keep = [i for i in range(len(history)) if rng.random() >= self.drop]
                if len(keep) < min_items:
                    keep = sorted(rng.sample(range(len(history)), min(min_items, len(history))))
                out.append(tuple(history[i] for i in keep))
        return out
