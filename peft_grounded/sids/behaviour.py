"""Item vectors from behaviour: what the interactions say about an item, for SIDs and the centroid start.

Text vectors place two items bought by the same people but described differently far apart. Here a
SASRec model is trained on the training part of the leave-one-out split (validation picks its epoch;
no test target is read), and its item embeddings are the items' *behaviour* vectors. Items with too few
training interactions have no reliable embedding: they (and items added to the index later) get one from
their text through a ridge map fitted on the warm items, :class:`ItemVectorMap`.

``ItemVectorsConfig.source`` chooses what the index is built from: ``"text"`` (the encoder's vectors, as
before), ``"behaviour"``, or ``"mix"``: both parts centred, L2-normalised per item and concatenated with
weights ``sqrt(1 - w)`` and ``sqrt(w)``, so squared distances are ``(1 - w)`` text plus ``w`` behaviour.
The index stores the map, so :func:`~peft_grounded.new_items.add_items` codes a new item from its text.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import numpy as np

logger = logging.getLogger(__name__)

VectorSource = Literal["text", "behaviour", "mix"]
VECTOR_SOURCES: tuple[str, ...] = get_args(VectorSource)
RIDGES = (0.1, 1.0, 10.0, 100.0, 1000.0)  # the map's penalty, chosen on held-out warm items unless given


@dataclass
class ItemVectorsConfig:
    """Which vectors the SIDs and the centroid start are built from."""

    item_vectors: VectorSource = field(
        default="text",
        metadata={
            "help": "text (the encoder's vectors), behaviour (SASRec item embeddings, text-mapped for "
            "items with few interactions) or mix (both, weighted by --behaviour_weight)."
        },
    )
    behaviour_weight: float = field(
        default=0.5,
        metadata={"help": "mix only: the behaviour part's share of squared distances, in (0, 1)."},
    )
    behaviour_min_interactions: int = field(
        default=5,
        metadata={
            "help": "Training interactions an item needs to keep its own behaviour vector; items with "
            "fewer get theirs from the text map."
        },
    )
    behaviour_ridge: float | None = field(
        default=None,
        metadata={
            "help": "Ridge penalty of the text-to-behaviour map (> 0; None: the best of 0.1-1000 on a "
            "held-out fifth of the warm items)."
        },
    )
    behaviour_epochs: int = field(
        default=200,
        metadata={
            "help": "SASRec's most epochs; it stops when validation has not improved for 10 epochs and keeps "
            "its best epoch, as the SASRec peer does. No time budget, so the same data and seed give the "
            "same vectors."
        },
    )

    def __post_init__(self) -> None:
        from .. import checks

        checks.raise_problems(
            "ItemVectorsConfig",
            [
                checks.one_of("item_vectors", self.item_vectors, VECTOR_SOURCES, flag="--item_vectors"),
                checks.number_in(
                    "behaviour_weight",
                    self.behaviour_weight,
                    0,
                    1,
                    low_open=True,
                    high_open=True,
                    flag="--behaviour_weight",
                ),
                checks.int_at_least(
                    "behaviour_min_interactions",
                    self.behaviour_min_interactions,
                    1,
                    flag="--behaviour_min_interactions",
                ),
                checks.number_in(
                    "behaviour_ridge",
                    self.behaviour_ridge,
                    0,
                    low_open=True,
                    flag="--behaviour_ridge",
                    none_ok=True,
                ),
                checks.int_at_least("behaviour_epochs", self.behaviour_epochs, 1, flag="--behaviour_epochs"),
            ],
        )

    @property
    def uses_behaviour(self) -> bool:
        return self.item_vectors != "text"


def _unit_rows(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


@dataclass
class ItemVectorMap:
    """Text vectors -> the index's vectors: ``behaviour = (text - text_mean) @ weight + behaviour_mean``,
    then, for ``"mix"``, both parts centred, unit-normalised and concatenated (see the module doc)."""

    source: VectorSource
    weight: np.ndarray  # [d_text, d_behaviour]
    text_mean: np.ndarray  # [d_text]
    behaviour_mean: np.ndarray  # [d_behaviour]
    behaviour_weight: float = 0.5

    @property
    def text_dim(self) -> int:
        return int(self.weight.shape[0])

    def behaviour(self, text: np.ndarray) -> np.ndarray:
        """The behaviour vectors the map predicts for ``text`` rows."""
        return (np.asarray(text, np.float32) - self.text_mean) @ self.weight + self.behaviour_mean

    def combine(self, text: np.ndarray, behaviour: np.ndarray) -> np.ndarray:
        """The index's vectors from both parts (``behaviour`` alone unless ``source == "mix"``)."""
        if self.source == "behaviour":
            return np.asarray(behaviour, np.float32)
        w = self.behaviour_weight
        t = _unit_rows(np.asarray(text, np.float32) - self.text_mean)
        b = _unit_rows(np.asarray(behaviour, np.float32) - self.behaviour_mean)
        return np.concatenate([np.sqrt(1 - w) * t, np.sqrt(w) * b], axis=1).astype(np.float32)

    def __call__(self, text: np.ndarray) -> np.ndarray:
        """The index's vectors of items known by their text only (cold, or added later)."""
        text = np.asarray(text, np.float32)
        if text.ndim != 2 or text.shape[1] != self.text_dim:
            raise ValueError(
                f"text vectors of shape {text.shape} for a map from {self.text_dim}-d text vectors: encode the "
                "items with the index's encoder"
            )
        return self.combine(text, self.behaviour(text))

    def tensors(self) -> dict[str, np.ndarray]:
        return {
            "vector_map.weight": np.ascontiguousarray(self.weight, np.float32),
            "vector_map.text_mean": np.ascontiguousarray(self.text_mean, np.float32),
            "vector_map.behaviour_mean": np.ascontiguousarray(self.behaviour_mean, np.float32),
        }

    def record(self) -> dict[str, Any]:
        return {"source": self.source, "behaviour_weight": self.behaviour_weight}

    @classmethod
    def from_files(cls, record: dict[str, Any], tensors: dict[str, np.ndarray]) -> ItemVectorMap:
        return cls(
            source=record["source"],
            behaviour_weight=float(record["behaviour_weight"]),
            weight=tensors["vector_map.weight"],
            text_mean=tensors["vector_map.text_mean"],
            behaviour_mean=tensors["vector_map.behaviour_mean"],
        )


def fit_ridge_map(text: np.ndarray, behaviour: np.ndarray, ridge: float) -> tuple[np.ndarray, ...]:
    """``(weight, text_mean, behaviour_mean)`` of the centred ridge regression of ``behaviour`` on ``text``."""
    t = np.asarray(text, np.float64)
    b = np.asarray(behaviour, np.float64)
    t_mean, b_mean = t.mean(0), b.mean(0)
    tc, bc = t - t_mean, b - b_mean
    weight = np.linalg.solve(tc.T @ tc + ridge * np.eye(t.shape[1]), tc.T @ bc)
    return weight.astype(np.float32), t_mean.astype(np.float32), b_mean.astype(np.float32)


def training_interactions(split: Any, item_ids: list[str]) -> np.ndarray:
    """Interactions per item in the split's training histories (validation and test targets left out)."""
    counts = Counter(i for user in split.users for i in user.history)
    return np.array([counts.get(i, 0) for i in item_ids], dtype=np.int64)


def behaviour_split(catalogue: Any, config: ItemVectorsConfig) -> Any:
    """The leave-one-out split whose training histories the behaviour vectors learn from; a catalogue whose
    interactions cannot train SASRec (none, or no user of 4 items) is refused, saying what behaviour vectors
    need and that ``--item_vectors text`` needs no interactions."""
    need = (
        f"--item_vectors {config.item_vectors} builds the SIDs from SASRec's item embeddings, learnt from the "
        "users' interactions (a training history of 2 items or more, then a validation and a test item)"
    )
    fix = (
        "give the catalogue with its interactions (LC-Rec: NAME.inter.json beside NAME.item.json; a table: "
        "--interactions FILE), or use --item_vectors text, which needs none"
    )
    if not catalogue.n_interactions:
        raise ValueError(f"{need}, and the catalogue {catalogue.name!r} holds no interactions; {fix}")
    longest = max(len(items) for items in catalogue.sequences.values())
    if longest < 4:
        raise ValueError(
            f"{need}, and no user of the catalogue {catalogue.name!r} has 4 items (the longest has {longest}; "
            f"{len(catalogue.sequences)} users, {catalogue.n_interactions} interactions); {fix}"
        )
    return catalogue.leave_one_out()


def item_vectors(
    split: Any,
    item_ids: list[str],
    text: np.ndarray,
    config: ItemVectorsConfig,
    seed: int = 0,
    *,
    show_progress: bool = False,
) -> tuple[np.ndarray, ItemVectorMap | None, dict[str, Any]]:
    """The vectors of ``config.item_vectors`` for ``item_ids`` (rows of ``text``), the map for later items
    (None for text) and figures for the index's ``quality`` (warm items, the map's held-out R^2).
    ``show_progress``: SASRec's fit shows its epochs on stderr (validation Recall, time left)."""
    text = np.asarray(text, np.float32)
    if not config.uses_behaviour:
        return text, None, {}
    from .sasrec import SASRecConfig
    from .sasrec_cache import shared_fit

    sasrec = shared_fit(
        split,
        item_ids,
        SASRecConfig(max_epochs=config.behaviour_epochs, seed=seed),
        show_progress=show_progress,
    )
    embedding = sasrec.model.item_embedding.weight[1:].detach().float().numpy()
    warm = training_interactions(split, item_ids) >= config.behaviour_min_interactions
    if warm.sum() < 2:
        raise ValueError(
            f"{int(warm.sum())} items have >= {config.behaviour_min_interactions} training interactions: too "
            "few to fit the text-to-behaviour map; lower --behaviour_min_interactions or use --item_vectors text"
        )
    ridges = RIDGES if config.behaviour_ridge is None else (config.behaviour_ridge,)
    r2 = {ridge: _held_out_r2(text[warm], embedding[warm], ridge, seed) for ridge in ridges}
    ridge = max(r2, key=lambda r: r2[r] if np.isfinite(r2[r]) else -np.inf)
    stats = {
        "item_vectors": config.item_vectors,
        "behaviour_warm_items": int(warm.sum()),
        "behaviour_sasrec_epoch": sasrec.best_epoch,
        "behaviour_ridge": ridge,
        "behaviour_map_r2": r2[ridge],
    }
    weight, t_mean, b_mean = fit_ridge_map(text[warm], embedding[warm], ridge)
    vector_map = ItemVectorMap(config.item_vectors, weight, t_mean, b_mean, config.behaviour_weight)
    behaviour = np.where(warm[:, None], embedding, vector_map.behaviour(text)).astype(np.float32)
    logger.info(
        "behaviour vectors: %d warm items keep SASRec's, %d from text (map R^2 %.3f on held-out warm items)",
        stats["behaviour_warm_items"],
        len(item_ids) - stats["behaviour_warm_items"],
        stats["behaviour_map_r2"],
    )
    return vector_map.combine(text, behaviour), vector_map, stats


def _held_out_r2(text: np.ndarray, behaviour: np.ndarray, ridge: float, seed: int) -> float:
    """R^2 of the map on a fifth of the warm items, fitted on the rest: how much behaviour text predicts."""
    order = np.random.default_rng(seed).permutation(len(text))
    test, train = order[: max(1, len(text) // 5)], order[max(1, len(text) // 5) :]
    if len(train) < 2:
        return float("nan")
    weight, t_mean, b_mean = fit_ridge_map(text[train], behaviour[train], ridge)
    predicted = (text[test] - t_mean) @ weight + b_mean
    residual = ((behaviour[test] - predicted) ** 2).sum()
    total = ((behaviour[test] - behaviour[test].mean(0)) ** 2).sum()
    return round(float(1 - residual / max(total, 1e-12)), 4)
