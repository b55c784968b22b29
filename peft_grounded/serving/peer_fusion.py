"""The peer fusion stored with an adapter: the model's beams fused with a SASRec peer's next-item
distribution, a product of experts ``log p_model(i) + weight * log p_peer(i)``.

The grounded LLM and an ID-based sequential recommender hit different users (DLLM2Rec, arXiv 2405.00338);
the product of the two lists serves what each knows. The peer is the SASRec fit of the adapter's training
split (the distillation teacher when the adapter was distilled, :func:`~peft_grounded.sids.sasrec_cache.shared_fit`),
and ``weight`` is chosen on the validation users (:func:`~peft_grounded.evaluation.peers.fit_peer_fusion`),
never on test: the reference weight 1 (two equal experts) unless another candidate beats it there with a
paired interval above 0.

Three files beside ``adapter_config.json``: the peer's ``sasrec.safetensors`` and ``sasrec.json``
(:meth:`~peft_grounded.sids.sasrec.SASRecRecommender.save`) and ``peer_fusion.json`` (the weight, the depth,
the SID index fingerprint, the validation table it was chosen on, and the sha256 of ``sasrec.json``, which
itself names its weights' sha256), written last. No pickle. ``peft-grounded fuse-peer`` writes them;
``evaluate`` and ``recommend`` (:func:`~.top_k.top_k_lists`) serve the fused lists when they are there.

Candidates of one list: the model's beams and the peer's ``max(depth, k)`` best items, both within the
trie (a candidate restriction) and without the user's history (the fused lists always leave it out); an item
outside the model's beams gets the beams' lowest log-probability.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..hub.repo import FUSION_FILES

FUSION_JSON = FUSION_FILES[0]
FORMAT = 1
DEFAULT_WEIGHTS = (0.25, 0.5, 1.0, 2.0, 4.0)
REFERENCE_WEIGHT = 1.0  # served unless validation tells another weight apart from it
DEFAULT_DEPTH = 20


class PeerFusionError(ValueError):
    """A peer fusion that cannot be fitted or used as given; the message names the fix."""


def product_of_experts(
    first: dict[Hashable, float], second: np.ndarray, items: Sequence[Hashable], weight: float, depth: int
) -> list[tuple[Hashable, float]]:
    """The ``depth`` best ``(item, score)`` by ``first(i) + weight * second(i)``, best first: ``first`` a
    list's log-probabilities (an item outside it gets the list's lowest), ``second`` log-probabilities over
    ``items`` (-inf: excluded). Candidates: ``first``'s items and ``second``'s top ``depth``; ties keep
    ``first``'s order."""
    floor = min(first.values()) if first else 0.0
    top = np.argsort(-second, kind="stable")[:depth]
    column = {item: c for c, item in enumerate(items)}
    candidates = list(first) + [items[c] for c in top if items[c] not in first]
    scored = []
    for order, item in enumerate(candidates):
        c = column.get(item)
        log_p = float(second[c]) if c is not None else -math.inf
        if log_p == -math.inf:
            continue  # excluded by the second (the user's history, the trie) or unknown to it
        scored.append((-(first.get(item, floor) + weight * log_p), order, item))
    return [(item, -score) for score, _, item in sorted(scored)[:depth]]


def peer_log_probs(peer: Any, histories: Sequence[Sequence[str]], trie: Any = None) -> np.ndarray:
    """A SASRec ``peer``'s next-item log-probabilities ``[users, items]`` (float64), each history's items and
    the items outside ``trie`` at -inf."""
    import torch

    rows = [torch.log_softmax(s.double(), -1).numpy() for s in peer.score_batches(histories)]
    out = np.concatenate(rows) if rows else np.zeros((0, len(peer.item_ids)))
    if trie is not None:
        out[:, [c for c, item in enumerate(peer.item_ids) if item not in trie]] = -math.inf
    return out


@dataclass
class PeerFusion:
    """A SASRec peer and the weight of its log-probabilities in the fused score."""

    peer: Any  # a SASRecRecommender over the index's items, in the index's order
    weight: float
    index_fingerprint: str
    depth: int = DEFAULT_DEPTH
    fitted_on: dict[str, Any] = field(default_factory=dict)  # the validation table the weight was chosen on

    def __post_init__(self) -> None:
        if isinstance(self.weight, bool) or not isinstance(self.weight, (int, float)):
            raise PeerFusionError(f"the fusion's weight is a number > 0, got {self.weight!r}")
        if not (self.weight > 0 and math.isfinite(self.weight)):
            raise PeerFusionError(f"the fusion's weight is a number > 0, got {self.weight!r}")
        if isinstance(self.depth, bool) or not isinstance(self.depth, int) or self.depth < 1:
            raise PeerFusionError(f"the fusion's depth is an integer >= 1, got {self.depth!r}")

    def describe(self) -> str:
        """One line: the peer, the weight and what it was chosen on."""
        line = f"peer fusion: log p_model + {self.weight:g} log p_SASRec over the top {self.depth}"
        users = self.fitted_on.get("users")
        return line + (f" (weight chosen on {users} validation users)" if users else "")

    def check_index(self, index: Any, where: str) -> None:
        """Refuse an index other than the one the peer was fitted for (fingerprint and item order)."""
        fix = "fit it again on this index (peft-grounded fuse-peer), or delete " + ", ".join(FUSION_FILES)
        if index.fingerprint() != self.index_fingerprint:
            raise PeerFusionError(
                f"the peer fusion in {where} was fitted for SID index {self.index_fingerprint}, not for this "
                f"one ({index.fingerprint()}); {fix}"
            )
        if [str(i) for i in index.item_ids] != [str(i) for i in self.peer.item_ids]:
            raise PeerFusionError(
                f"the peer in {where} scores other items than its SID index {self.index_fingerprint}: it was "
                f"edited or damaged; {fix}"
            )

    def peer_log_probs(self, histories: Sequence[Sequence[str]], trie: Any = None) -> np.ndarray:
        """:func:`peer_log_probs` of this fusion's peer."""
        return peer_log_probs(self.peer, histories, trie)

    def apply(
        self,
        beams: Any,
        histories: Sequence[Sequence[str]],
        k: int,
        trie: Any = None,
        log_probs: np.ndarray | None = None,
    ) -> Any:
        """The fused ``k``-item lists of the model's ``beams`` (:class:`~peft_grounded.decoding.Recommendations`
        for ``histories``), history items and items outside ``trie`` left out. ``log_probs``: the peer's, when
        :meth:`peer_log_probs` already gave them for these histories and trie."""
        if log_probs is None:
            log_probs = self.peer_log_probs(histories, trie)
        items, scores = [], []
        for history, row, values, peer in zip(histories, beams.items, beams.scores, log_probs, strict=True):
            seen = set(history)
            first = {i: float(s) for i, s in zip(row, values, strict=True) if i not in seen}
            fused = product_of_experts(first, peer, self.peer.item_ids, self.weight, max(self.depth, k))[:k]
            items.append([i for i, _ in fused])
            scores.append([s for _, s in fused])
        return replace(beams, items=items, scores=scores, k=k)

    # ------------------------------------------------------------------------------------------ save / load

    def save(self, folder: str | Path) -> list[Path]:
        """Write the peer's two files and ``peer_fusion.json`` into ``folder`` (each atomically; the JSON,
        written last, names ``sasrec.json``'s sha256, so a reader never pairs it with another peer)."""
        from .._io import atomic_write_text

        folder = Path(folder)
        self.peer.save(folder)
        record = {
            "format": FORMAT,
            "weight": float(self.weight),
            "depth": self.depth,
            "sid_index_fingerprint": self.index_fingerprint,
            "peer_sha256": hashlib.sha256((folder / FUSION_FILES[1]).read_bytes()).hexdigest(),
            "fitted_on": self.fitted_on,
        }
        atomic_write_text(folder / FUSION_JSON, json.dumps(record, indent=1) + "\n")
        return [folder / name for name in FUSION_FILES]

    @classmethod
    def load(cls, folder: str | Path) -> PeerFusion | None:
        """The fusion saved in ``folder``, or ``None`` when it holds none."""
        from .._io import read_json
        from ..sids.sasrec import SASRecRecommender

        folder = Path(folder)
        if not (folder / FUSION_JSON).is_file():
            return None
        fix = f"fit it again (peft-grounded fuse-peer) or delete {', '.join(FUSION_FILES)}"
        record = read_json(folder / FUSION_JSON, fix=fix)
        keys = ("format", "weight", "depth", "sid_index_fingerprint", "peer_sha256")
        if not isinstance(record, dict) or any(key not in record for key in keys):
            raise PeerFusionError(f"{folder / FUSION_JSON} is not a saved peer fusion (needs {keys}); {fix}")
        if record["format"] != FORMAT:
            raise PeerFusionError(
                f"{folder / FUSION_JSON} has format {record['format']!r}; this version reads {FORMAT}. {fix}"
            )
        try:
            peer_record = (folder / FUSION_FILES[1]).read_bytes()
        except FileNotFoundError:
            raise PeerFusionError(f"{folder} has {FUSION_JSON} but no {FUSION_FILES[1]}; {fix}") from None
        if hashlib.sha256(peer_record).hexdigest() != record["peer_sha256"]:
            raise PeerFusionError(
                f"{folder / FUSION_FILES[1]} is not the peer {FUSION_JSON} was saved with; {fix}"
            )
        try:
            peer = SASRecRecommender.load(folder)
        except (ValueError, KeyError, FileNotFoundError) as err:
            raise PeerFusionError(f"the peer in {folder} does not load ({err}); {fix}") from None
        return cls(
            peer,
            record["weight"],
            record["sid_index_fingerprint"],
            depth=record["depth"],
            fitted_on=dict(record.get("fitted_on") or {}),
        )


__all__ = [
    "FUSION_FILES",
    "REFERENCE_WEIGHT",
    "PeerFusion",
    "PeerFusionError",
    "peer_log_probs",
    "product_of_experts",
]
