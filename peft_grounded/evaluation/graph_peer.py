"""TGH, the transition-graph heuristic (arXiv 2605.07125, GraphRec), as a peer: no training, one graph.

The graph: a directed edge ``a -> b`` for every consecutive pair of a training history (the leave-one-out
split's ``history``: a validation or test item never adds an edge), weighted by how often the pair occurs
(a repeated item, ``a -> a``, adds none). For a user whose last item is ``v`` the items are ranked

* by ring: the breadth-first distance from ``v`` in the graph taken undirected (ring 1: the items that
  followed or preceded ``v`` in some history; ring 2: their neighbours; ... up to ``max_ring``), nearer
  rings first, then every item beyond them (the text KNN fill: the list is always full, and a last item
  with no edge, a cold one, gets text KNN alone);
* within a ring by the cosine of the items' text vectors to ``v``'s (the SID index's own vectors, as
  :class:`~.peers.TextKNN` reads them), ring 1 with ``count_bonus`` times the transition count ``v -> i``
  added (only ring 1 has one: an item ``v`` led to is ``v``'s neighbour).

The user's history items are never recommended; ties go to catalogue order. A history with no item the peer
knows gets the items most often a transition's target (the training-target popularity). ``count_bonus`` (and
``max_ring``) are chosen on the validation users by :func:`choose_settings`, never on test.

One score per item carries that order: ``cos + count_bonus * count + RING_GAP * (max_ring + 1 - ring)`` (the
gap term 0 beyond the rings). ``RING_GAP`` exceeds the range of a cosine, so rings never mix;
:meth:`TransitionGraphPeer.log_probs` is its ``log_softmax`` (a fusion's weight then acts as its inverse
temperature), and :meth:`TransitionGraphPeer.score_batches` gives the scores as
:func:`~peft_grounded.serving.peer_fusion.peer_log_probs` reads a peer's.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from itertools import pairwise
from typing import Any

import numpy as np

from .. import checks
from .metrics import rank_metrics

RING_GAP = 4.0  # > 2, the range of a cosine: every item of ring r scores above every item of ring r + 1
DEFAULT_BONUSES = (0.0, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0)
DEFAULT_RINGS = (1, 2, 3)


@dataclass(frozen=True)
class TGHSettings:
    """How TGH ranks: the ring-1 count bonus, the rings ranked before the text fill, the batch size.

    The defaults are what :func:`choose_settings` chose on the validation users of Amazon Office (0.3, 1);
    ML-100K's chose 0.1, 1 (BENCHMARKS.md, "The transition-graph heuristic (TGH) as a peer")."""

    count_bonus: float = field(
        default=0.3,
        metadata={
            "help": "Ring 1: added to an item's text similarity per transition from the last item to it "
            "(0: similarity alone; large: transition count first). Chosen on validation (choose_settings)."
        },
    )
    max_ring: int = field(
        default=1,
        metadata={
            "help": "Rings of the graph ranked before the text KNN fill (1: the last item's neighbours)."
        },
    )
    batch_size: int = field(default=512, metadata={"help": "Histories scored at once."})

    def __post_init__(self) -> None:
        checks.raise_problems(
            "TGHSettings",
            [
                checks.number_in("count_bonus", self.count_bonus, 0),
                checks.int_at_least("max_ring", self.max_ring, 1),
                checks.int_at_least("batch_size", self.batch_size, 1),
            ],
        )


def transition_counts(histories: Iterable[Sequence[str]]) -> Counter[tuple[str, str]]:
    """``(a, b) -> count`` of the consecutive pairs ``a, b`` of the histories (``a == b`` left out)."""
    counts: Counter[tuple[str, str]] = Counter()
    for history in histories:
        counts.update((a, b) for a, b in pairwise(history) if a != b)
    return counts


def _csr(rows: np.ndarray, cols: np.ndarray, values: np.ndarray, n: int) -> tuple[np.ndarray, ...]:
    """``(indptr, indices, values)`` of a sparse ``n x n`` matrix from its entries (unique ``(row, col)``)."""
    order = np.lexsort((cols, rows))
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n), out=indptr[1:])
    return indptr, cols[order], values[order]


class TransitionGraphPeer:
    """TGH over ``item_ids``: the transition ``edges`` (``(a, b) -> count``) and one text vector per item.

    :meth:`fit` reads the graph from a split's training histories; :meth:`from_index` also reads the vectors
    from the SID index (as :meth:`~.peers.TextKNN.from_index`)."""

    def __init__(
        self,
        item_ids: Sequence[str],
        vectors: Any,
        edges: Mapping[tuple[str, str], int],
        settings: TGHSettings | None = None,
        *,
        name: str = "",
    ) -> None:
        self.item_ids = list(item_ids)
        self.settings = settings or TGHSettings()
        if not isinstance(self.settings, TGHSettings):
            raise TypeError(f"settings must be a TGHSettings, got {type(self.settings).__name__}")
        self._row = {item: row for row, item in enumerate(self.item_ids)}
        if len(self._row) != len(self.item_ids):
            raise ValueError("TGH item ids must be unique")
        vectors = np.asarray(vectors, dtype=np.float64)
        if vectors.ndim != 2 or len(vectors) != len(self.item_ids):
            raise ValueError(
                f"TGH needs one vector per item: got shape {vectors.shape} for {len(self.item_ids)} items"
            )
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        if not np.isfinite(vectors).all() or (norms == 0).any():
            raise ValueError(
                "TGH item vectors must be finite and non-zero; re-encode the catalogue (a zeroed or corrupt "
                "embedding cache gives such vectors: clear it)"
            )
        self.vectors = vectors / norms
        unknown = sorted({i for pair in edges for i in pair if i not in self._row})
        if unknown:
            raise ValueError(
                f"{len(unknown)} items of the transitions are not among the peer's items (e.g. {unknown[:3]}); "
                "pass the catalogue's (or the SID index's) item ids"
            )
        bad = [
            (pair, c) for pair, c in edges.items() if not (checks.is_int(c) and c >= 1) or pair[0] == pair[1]
        ]
        if bad:
            raise ValueError(f"transition counts are integers >= 1 between two items, got e.g. {bad[:3]}")
        self.edges = dict(edges)
        self.name = name or "TGH (transition graph)"
        n = len(self.item_ids)
        src = np.array([self._row[a] for a, _ in self.edges], dtype=np.int64)
        dst = np.array([self._row[b] for _, b in self.edges], dtype=np.int64)
        count = np.array(list(self.edges.values()), dtype=np.float64)
        self._out = _csr(src, dst, count, n)  # v -> its successors and the counts
        pairs = np.unique(np.concatenate([src * n + dst, dst * n + src]))
        self._nbr = _csr(pairs // n, pairs % n, np.ones(len(pairs)), n)[:2]  # undirected neighbours
        self._popularity = np.bincount(dst, weights=count, minlength=n)  # how often a transition's target

    @classmethod
    def fit(
        cls,
        split: Any,
        item_ids: Sequence[str],
        vectors: Any,
        settings: TGHSettings | None = None,
        **kwargs: Any,
    ) -> TransitionGraphPeer:
        """The graph of ``split``'s training histories (validation and test items add no edge)."""
        return cls(item_ids, vectors, transition_counts(u.history for u in split.users), settings, **kwargs)

    @classmethod
    def from_index(
        cls,
        index: Any,
        catalogue: Any,
        split: Any,
        encoder: Any = None,
        *,
        settings: TGHSettings | None = None,
        cache_dir: Any = None,
        show_progress: bool = False,
    ) -> TransitionGraphPeer:
        """:meth:`fit` over the index's items with the vectors its SIDs came from (its text template, its
        encoder, default the packaged MiniLM, the embedding cache)."""
        vectors = index.text_vectors(catalogue, encoder, cache_dir=cache_dir, show_progress=show_progress)
        return cls.fit(split, list(index.item_ids), vectors, settings)

    def with_settings(self, settings: TGHSettings) -> TransitionGraphPeer:
        """The same graph and vectors ranked with other settings (nothing copied)."""
        if not isinstance(settings, TGHSettings):
            raise TypeError(f"settings must be a TGHSettings, got {type(settings).__name__}")
        other = object.__new__(type(self))
        other.__dict__.update(self.__dict__, settings=settings)
        return other

    # ------------------------------------------------------------------------------------------ the graph

    def rings(self, item: str, max_ring: int | None = None) -> np.ndarray:
        """``[items]`` int: each item's ring around ``item`` (1 ..), 0 beyond ``max_ring`` (default: the
        settings'), unreachable, or ``item`` itself."""
        return self._rings(self._row[item], max_ring or self.settings.max_ring)

    def _rings(self, row: int, max_ring: int) -> np.ndarray:
        indptr, indices = self._nbr
        ring = np.zeros(len(self.item_ids), dtype=np.int32)
        seen = np.zeros(len(self.item_ids), dtype=bool)
        seen[row] = True
        frontier = np.array([row])
        for r in range(1, max_ring + 1):
            starts, lengths = indptr[frontier], indptr[frontier + 1] - indptr[frontier]
            total = int(lengths.sum())
            if not total:
                break
            before = np.cumsum(lengths) - lengths
            found = np.unique(indices[np.repeat(starts - before, lengths) + np.arange(total)])
            frontier = found[~seen[found]]
            if not len(frontier):
                break
            ring[frontier], seen[frontier] = r, True
        return ring

    def _counts_from(self, row: int) -> np.ndarray:
        indptr, indices, values = self._out
        out = np.zeros(len(self.item_ids))
        out[indices[indptr[row] : indptr[row + 1]]] = values[indptr[row] : indptr[row + 1]]
        return out

    def _parts(self, histories: Sequence[Sequence[str]], max_ring: int) -> dict[str, Any]:
        """What the scores of a batch are made of, for every ``count_bonus`` and ring limit up to ``max_ring``:
        the last known items, similarities, counts and rings (``[n, items]``) and the history rows."""
        if isinstance(histories, str) or any(isinstance(h, str) for h in histories):
            raise TypeError("histories must be a list of item-id lists, one per user (got a string)")
        seen = [[self._row[i] for i in h if i in self._row] for h in histories]
        last = np.array([rows[-1] if rows else -1 for rows in seen], dtype=np.int64)
        n = len(self.item_ids)
        sims, counts = np.zeros((len(seen), n)), np.zeros((len(seen), n))
        rings = np.zeros((len(seen), n), dtype=np.int32)
        known = last >= 0
        sims[known] = self.vectors[last[known]] @ self.vectors.T
        cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for u, row in enumerate(last.tolist()):
            if row < 0:
                continue
            if row not in cache:
                cache[row] = (self._rings(row, max_ring), self._counts_from(row))
            rings[u], counts[u] = cache[row]
        return {"last": last, "sims": sims, "counts": counts, "rings": rings, "seen": seen}

    def _combine(self, parts: Mapping[str, Any], settings: TGHSettings) -> np.ndarray:
        """``[n, items]`` float64 scores of :meth:`_parts` under ``settings``, the history at ``-inf``."""
        rings = parts["rings"]
        inside = (rings > 0) & (rings <= settings.max_ring)
        scores = parts["sims"] + settings.count_bonus * parts["counts"]
        scores += RING_GAP * np.where(inside, settings.max_ring + 1 - rings, 0)
        empty = parts["last"] < 0
        if empty.any():
            top = self._popularity.max()
            scores[empty] = self._popularity / top if top > 0 else 0.0
        for u, rows in enumerate(parts["seen"]):
            if rows:
                scores[u, rows] = -math.inf
        return scores

    # ------------------------------------------------------------------------------------------ ranking

    def scores(self, histories: Sequence[Sequence[str]]) -> np.ndarray:
        """``[n, items]`` float64 scores (the order above; higher first), each history's items at ``-inf``."""
        return self._combine(self._parts(histories, self.settings.max_ring), self.settings)

    def recommend(self, histories: Sequence[Sequence[str]], k: int) -> list[list[str]]:
        """The ``k`` best items of each history (ring by ring, then the text fill), best first; fewer only
        when the catalogue holds fewer items outside the history."""
        if not checks.is_int(k) or k < 1:
            raise ValueError(f"k must be an integer >= 1, got {k!r}")
        out: list[list[str]] = []
        size = self.settings.batch_size
        for start in range(0, len(histories), size):
            scores = self.scores(histories[start : start + size])
            top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
            out.extend(
                [self.item_ids[j] for j in row if np.isfinite(s[j])]
                for row, s in zip(top, scores, strict=True)
            )
        return out

    def score_batches(self, histories: Sequence[Sequence[str]]) -> Iterator[Any]:
        """:meth:`scores` as float64 torch tensors, batch by batch (what ``peer_log_probs`` reads)."""
        import torch

        size = self.settings.batch_size
        for start in range(0, len(histories), size):
            yield torch.from_numpy(self.scores(histories[start : start + size]))

    def log_probs(self, histories: Sequence[Sequence[str]], trie: Any = None) -> np.ndarray:
        """Next-item log-probabilities ``[users, items]`` (float64, the ``log_softmax`` of :meth:`scores`), each
        history's items and the items outside ``trie`` at ``-inf``: a peer a fusion can weigh."""
        from ..serving.peer_fusion import peer_log_probs

        return peer_log_probs(self, histories, trie)


# ---------------------------------------------------------------------------------------------- the choice


def choose_settings(
    peer: TransitionGraphPeer,
    split: Any,
    bonuses: Sequence[float] = DEFAULT_BONUSES,
    rings: Sequence[int] = DEFAULT_RINGS,
    eval_settings: Any = None,
    *,
    k: int = 10,
) -> tuple[TGHSettings, list[dict[str, Any]]]:
    """The ``count_bonus`` and ``max_ring`` with the best Recall@``k`` (then NDCG@``k``; then the earlier in
    ``bonuses`` x ``rings``) on ``split``'s validation users (the sample ``eval_settings`` names, default all):
    history -> validation item, the history left out, ranked exactly as :meth:`~TransitionGraphPeer.recommend`
    ranks. Returns the chosen settings (the peer's batch size) and one table row per candidate."""
    from .metrics import EvalSettings
    from .reports import sampled_users

    candidates = [replace(peer.settings, count_bonus=b, max_ring=r) for r in rings for b in bonuses]
    if not candidates:
        raise ValueError("choose_settings needs at least one count_bonus and one max_ring")
    examples, _, _ = sampled_users(split, "valid", eval_settings or EvalSettings(), set(), None)
    if not examples:
        raise ValueError("the split has no validation users to choose TGH's settings on")
    histories = [list(h) for _, h, _ in examples]
    targets = [peer._row.get(t, -1) for *_, t in examples]
    ranks: list[list[int | None]] = [[] for _ in candidates]
    size = peer.settings.batch_size
    for start in range(0, len(histories), size):
        parts = peer._parts(histories[start : start + size], max(rings))
        wanted = np.array(targets[start : start + size])
        for c, settings in enumerate(candidates):
            scores = peer._combine(parts, settings)
            for row, t in zip(scores, wanted.tolist(), strict=True):
                if t < 0 or not np.isfinite(row[t]):
                    ranks[c].append(None)
                    continue
                # as a stable sort ranks: ties go to the item earlier in the catalogue
                rank = int((row > row[t]).sum() + (row[:t] == row[t]).sum())
                ranks[c].append(rank)
    table = []
    for settings, found in zip(candidates, ranks, strict=True):
        metrics = rank_metrics(found, (k,))
        table.append({**asdict(settings), **metrics})
    best = max(range(len(table)), key=lambda c: (table[c][f"recall@{k}"], table[c][f"ndcg@{k}"], -c))
    return candidates[best], table
