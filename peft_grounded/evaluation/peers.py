"""One interface for the recommenders a shop could run without this package, scored like the LLM.

A peer is anything with ``name`` and ``recommend(histories, k)``: for each history (item ids, oldest
first) the ``k`` item ids it would show, best first. :func:`peer_records` scores a peer on exactly the users
:func:`~peft_grounded.evaluation.reports` samples with the same :class:`~peft_grounded.evaluation.EvalSettings`
(the same seeded "all" and "cold" samples of each part), and returns the same per-user records (``user``,
``target``, ``all``, ``cold``, 0-based ``rank`` or ``None``), so that peers and LLM strategies go into one
table with paired bootstrap intervals (:func:`~peft_grounded.evaluation.compare_users`).

:class:`TextKNN` (cosine neighbours in the SID index's own item-vector space, no training) follows; SASRec is
:mod:`peft_grounded.sids.sasrec`, TGH (the transition-graph heuristic) :mod:`.graph_peer`, and PEFT's own
default path (:func:`~peft_grounded.sids.extended_base.peft_default_model`) is run by the experiment runner as strategy
``peft_default``.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from ..intervals import bootstrap_interval
from ..serving.peer_fusion import (
    DEFAULT_DEPTH,
    DEFAULT_WEIGHTS,
    REFERENCE_WEIGHT,
    PeerFusion,
    PeerFusionError,
    item_difference,
    peer_log_probs,
)
from ..sids.sasrec import exclude_seen
from .metrics import rank_metrics, target_rank
from .reports import EvalSettings, Results, _autocast, sampled_users, user_records


@runtime_checkable
class Recommender(Protocol):
    """A ranked list of item ids per user history."""

    name: str

    def recommend(self, histories: Sequence[Sequence[str]], k: int) -> list[list[str]]:
        """For each history (oldest item first), its ``k`` recommended item ids, best first."""
        ...


def peer_records(
    recommender: Recommender,
    split: Any,
    parts: tuple[str, ...] = ("valid", "test"),
    settings: EvalSettings | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """``{part: [record, ...]}`` of ``recommender`` on the users ``evaluate`` scores with ``settings``.

    The history of a validation user is its training history; of a test user, the training history and the
    validation item (the whole history up to the target, as the LLM's prompts give it)."""
    settings = settings or EvalSettings()
    k = max(settings.ks)
    cold_items = split.cold_items(settings.cold_max_count)
    out: dict[str, list[dict[str, Any]]] = {}
    for part in parts:
        chosen, cold_chosen, _ = sampled_users(split, part, settings, cold_items, None)
        records = user_records(chosen, cold_chosen)
        history = {e[0]: e[1] for e in chosen + cold_chosen}
        lists = recommender.recommend([history[r["user"]] for r in records], k)
        if len(lists) != len(records):
            raise RuntimeError(
                f"{recommender.name} returned {len(lists)} lists for {len(records)} histories; a peer must "
                "return one list per history"
            )
        for record, items in zip(records, lists, strict=True):
            if len(items) < k:
                raise ValueError(
                    f"{recommender.name} recommended {len(items)} items for user {record['user']!r}, fewer "
                    f"than K={k}; return at least max(ks) items per history"
                )
            record["rank"] = target_rank(items[:k], record["target"])
        out[part] = records
    return out


def peer_results(records: dict[str, list[dict[str, Any]]], settings: EvalSettings | None = None) -> Results:
    """Aggregate ``{part: {"all", "cold"}}`` Recall/NDCG of :func:`peer_records`' output."""
    settings = settings or EvalSettings()
    subsets = ("all", "cold") if settings.cold else ("all",)
    return {
        part: {s: rank_metrics([r["rank"] for r in rows if r[s]], settings.ks) for s in subsets}
        for part, rows in records.items()
    }


# Text KNN: rank every item by the cosine between its text vector and the user's, no training.
#
# The vectors are the SID index's own (the catalogue's items rendered with the index's text template and
# encoded by its encoder: the vectors the SIDs were quantised from), so this peer sees exactly the
# semantics the SID tokens start from. The user's vector is the last item's (``profile="last"``) or a
# recency-weighted mean of the last ``window`` items (``"recency"``: weight ``decay ** age``, the newest
# item age 0). A user's history items are never recommended.


@dataclass
class TextKNN:
    """Cosine nearest neighbours of the user's text profile among ``vectors`` (one row per item id)."""

    item_ids: list[str]
    vectors: np.ndarray
    profile: Literal["last", "recency"] = "last"
    decay: float = field(default=0.7, metadata={"help": "recency profile: weight of an item one step older"})
    window: int = field(default=20, metadata={"help": "recency profile: items of history it averages"})
    batch_size: int = 1024
    name: str = ""

    def __post_init__(self) -> None:
        vectors = np.asarray(self.vectors, dtype=np.float32)
        if vectors.ndim != 2 or len(vectors) != len(self.item_ids):
            raise ValueError(
                f"TextKNN needs one vector per item: got shape {vectors.shape} for {len(self.item_ids)} items"
            )
        if self.profile not in ("last", "recency"):
            raise ValueError(f"profile must be 'last' or 'recency', got {self.profile!r}")
        if not 0 < self.decay <= 1:
            raise ValueError(f"decay must be in (0, 1], got {self.decay!r}")
        if self.window < 1 or self.batch_size < 1:
            raise ValueError(f"window and batch_size must be >= 1, got {self.window} and {self.batch_size}")
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        if not np.isfinite(vectors).all() or (norms == 0).any():
            raise ValueError(
                "TextKNN item vectors must be finite and non-zero; re-encode the catalogue (a zeroed or "
                "corrupt embedding cache gives such vectors: clear it)"
            )
        self.vectors = vectors / norms
        self._row = {item: row for row, item in enumerate(self.item_ids)}
        if len(self._row) != len(self.item_ids):
            raise ValueError("TextKNN item ids must be unique")
        self.name = self.name or ("text KNN (last item)" if self.profile == "last" else "text KNN (recency)")

    @classmethod
    def from_index(
        cls,
        index: Any,
        catalogue: Any,
        encoder: Any = None,
        *,
        cache_dir: Any = None,
        show_progress: bool = False,
        **kwargs: Any,
    ) -> TextKNN:
        """The index's items with the vectors the SIDs came from: its text template, its encoder (checked
        against the index's fingerprint; default: the packaged MiniLM), the embedding cache."""
        vectors = index.text_vectors(catalogue, encoder, cache_dir=cache_dir, show_progress=show_progress)
        return cls(list(index.item_ids), vectors, **kwargs)

    def user_vectors(self, histories: Sequence[Sequence[str]]) -> np.ndarray:
        """``[n, d]`` profile vectors (unknown items ignored; an all-unknown history gives a zero vector)."""
        out = np.zeros((len(histories), self.vectors.shape[1]), dtype=np.float32)
        for u, history in enumerate(histories):
            rows = [self._row[i] for i in history if i in self._row]
            if not rows:
                continue
            if self.profile == "last":
                out[u] = self.vectors[rows[-1]]
            else:
                rows = rows[-self.window :]
                weights = self.decay ** np.arange(len(rows) - 1, -1, -1, dtype=np.float32)
                out[u] = weights @ self.vectors[rows]
        return out

    def scores(self, histories: Sequence[Sequence[str]]) -> np.ndarray:
        """``[n, items]`` cosine scores, the history items at ``-inf``."""
        scores = self.user_vectors(histories) @ self.vectors.T
        seen = [[self._row[i] for i in h if i in self._row] for h in histories]
        return exclude_seen(scores, seen)

    def recommend(self, histories: Sequence[Sequence[str]], k: int) -> list[list[str]]:
        """The ``k`` nearest items of each history's profile, nearest first (ties: catalogue order); fewer
        when the catalogue holds fewer items outside the history."""
        out: list[list[str]] = []
        for start in range(0, len(histories), self.batch_size):
            scores = self.scores(histories[start : start + self.batch_size])
            top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
            out.extend(
                [self.item_ids[j] for j in row if np.isfinite(s[j])]
                for row, s in zip(top, scores, strict=True)
            )
        return out


# The path a user has without this package: ``resize_token_embeddings(mean_resizing=True)`` and PEFT's own
# ``LoraConfig(trainable_token_indices=...)``, trained by the same recommendation SFT at the same budget.
#
# transformers' ``mean_resizing`` starts every new row at a draw from N(mean, 1e-9 * cov) of the old rows,
# which is the vocabulary mean in practice (the GTI paper's baseline); PEFT's trainable tokens then train a
# delta on those rows (tied heads follow the input rows) next to the LoRA.


# ------------------------------------------------------------------------------------------------ fusion
#
# A peer fused with the model's beams (:class:`~peft_grounded.serving.peer_fusion.PeerFusion`, served by
# ``top_k_lists``): its weight chosen on the validation users, the model alone and the peer alone beside it.


def choose_weight(
    peer: Any,
    beams: Any,
    histories: Sequence[Sequence[str]],
    targets: Sequence[str],
    *,
    weights: Sequence[float] = DEFAULT_WEIGHTS,
    reference: float = REFERENCE_WEIGHT,
    depth: int = DEFAULT_DEPTH,
    k: int = 10,
    trie: Any = None,
) -> tuple[float, list[dict[str, Any]]]:
    """The weight to serve, chosen on these held-out ``(history, target)`` pairs, and the table behind it.

    ``reference`` is served unless the candidate of ``weights`` with the highest Recall@``k`` (then NDCG@``k``)
    beats it with a paired 95% bootstrap interval of Recall@``k`` above 0: among weights the users cannot
    tell apart, the choice would be noise. The table has one row per weight (the reference among them, each
    with its paired interval against the reference), and the model alone and the peer alone as its controls
    (``weight`` None and ``"peer"``)."""
    if not weights or any(isinstance(w, bool) or not (w > 0 and math.isfinite(w)) for w in weights):
        raise PeerFusionError(f"weights are numbers > 0, got {list(weights)!r}")
    if isinstance(reference, bool) or not (reference > 0 and math.isfinite(reference)):
        raise PeerFusionError(f"the reference weight is a number > 0, got {reference!r}")
    if len(histories) != len(targets) or not histories:
        raise PeerFusionError(f"{len(histories)} histories and {len(targets)} targets: give one target each")
    names = (f"recall@{k}", f"ndcg@{k}")

    def hits(lists: Sequence[Sequence[Hashable]]) -> tuple[dict[str, Any], np.ndarray]:
        ranks = [target_rank(list(items)[:k], t) for items, t in zip(lists, targets, strict=True)]
        metrics = rank_metrics(ranks, (k,))
        return {name: metrics[name] for name in names}, np.array([r is not None for r in ranks], dtype=float)

    log_probs = peer_log_probs(peer, histories, trie)
    alone, _ = hits([[i for i in r if i not in set(h)] for r, h in zip(beams.items, histories, strict=True)])
    peer_alone, _ = hits(
        [
            [peer.item_ids[c] for c in np.argsort(-lp, kind="stable")[:k] if lp[c] > -math.inf]
            for lp in log_probs
        ]
    )
    table = [{"weight": None, **alone}, {"weight": "peer", **peer_alone}]
    per_user = {}
    for weight in sorted({float(w) for w in weights} | {float(reference)}):
        fusion = PeerFusion(peer, weight, "", depth=depth)
        metrics, per_user[weight] = hits(fusion.apply(beams, histories, k, trie, log_probs).items)
        table.append({"weight": weight, **metrics})
    for row in table[2:]:
        interval = bootstrap_interval([per_user[row["weight"]] - per_user[float(reference)]])
        row[f"{names[0]}_minus_reference"] = {key: interval[key] for key in ("difference", "low", "high")}
    best = max(table[2:], key=lambda r: (r[names[0]], r[names[1]]))
    beats = best[f"{names[0]}_minus_reference"]["low"] > 0
    return (best["weight"] if beats else float(reference)), table


def fit_peer_fusion(
    model: Any,
    tokenizer: Any,
    index: Any,
    split: Any,
    peer: Any,
    settings: Any = None,
    *,
    catalogue: Any = None,
    fmt: Any = None,
    weights: Sequence[float] = DEFAULT_WEIGHTS,
    reference: float = REFERENCE_WEIGHT,
    depth: int = DEFAULT_DEPTH,
    show_progress: bool = False,
) -> Any:
    """A :class:`PeerFusion` of ``peer`` whose weight is chosen (:func:`choose_weight`) on ``split``'s
    validation users: the sample ``settings`` (:class:`~peft_grounded.evaluation.EvalSettings`) names, decoded
    as ``evaluate`` decodes them (its beams, bf16 and batch size), their whole history left out."""
    from ..decoding.search import model_beams, sid_trie
    from ..sids.extended_base import prompt_format_of

    settings = settings or EvalSettings()
    fingerprint = index.fingerprint()
    PeerFusion(peer, 1.0, fingerprint, depth=depth)  # checks the depth
    difference = item_difference(peer.item_ids, index.item_ids)
    if difference:
        raise PeerFusionError(
            f"the peer was fitted on other items than the SID index {fingerprint} ({difference}); pass the "
            "SASRec fitted on this index's items (fit_sasrec(split, index.item_ids), or the saved teacher of an "
            "sft run on this index)"
        )
    examples, _, _ = sampled_users(split, "valid", settings, set(), None)
    if not examples:
        raise ValueError("the split has no validation users to choose the fusion's weight on")
    histories, targets = [list(h) for _, h, _ in examples], [t for *_, t in examples]
    trie = sid_trie(tokenizer, index)
    width = min(len(trie), max(settings.num_beams, *settings.ks))  # the width evaluate decodes at
    with _autocast(model, settings):  # as evaluate decodes
        beams = model_beams(
            model,
            tokenizer,
            index,
            histories,
            width,
            fmt=fmt or prompt_format_of(model),
            catalogue=catalogue,
            trie=trie,
            batch_size=settings.decode_batch_size,
            exclude=histories,
            show_progress=show_progress,
        )
    weight, table = choose_weight(
        peer, beams, histories, targets, weights=weights, reference=reference, depth=depth, k=10, trie=trie
    )
    fitted_on = {
        "part": "valid",
        "users": len(histories),
        "seed": settings.seed,
        "num_beams": width,
        "reference": float(reference),
        "table": table,
    }
    return PeerFusion(peer, weight, fingerprint, depth=depth, fitted_on=fitted_on)
