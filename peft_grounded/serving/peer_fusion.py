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


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


FUSION_FIELDS = {  # field of peer_fusion.json -> (what it must be, its check)
    "format": (f"the integer {FORMAT}", lambda v: v == FORMAT and not isinstance(v, bool)),
    "weight": ("a number > 0", lambda v: _number(v) and v > 0),
    "depth": ("an integer >= 1", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1),
    "sid_index_fingerprint": ("a string", lambda v: isinstance(v, str)),
    "peer_sha256": ("a sha256 hex string", lambda v: isinstance(v, str) and len(v) == 64),
    "fitted_on": ("an object (the validation table)", lambda v: isinstance(v, dict)),
}


def stored_fix(folder: str | Path) -> str:
    """What to do about a fusion stored in ``folder`` that cannot be served: fit it again, or delete it."""
    return (
        f"fit it again with `peft-grounded fuse-peer --adapter {folder} --sid_index SID_INDEX`, or delete "
        f"{', '.join(FUSION_FILES[:-1])} and {FUSION_FILES[-1]} from {folder} to serve the model alone"
    )


def item_difference(peer_items: Sequence[Hashable], index_items: Sequence[Hashable]) -> str | None:
    """How a peer's items differ from an index's (``None``: the same, in the same order), for a message."""
    ours, theirs = [str(i) for i in peer_items], [str(i) for i in index_items]
    if ours == theirs:
        return None
    only_peer, only_index = sorted(set(ours) - set(theirs)), sorted(set(theirs) - set(ours))
    if not only_peer and not only_index:
        return f"the same {len(ours)} items in another order"
    said = f"{len(ours)} items against the index's {len(theirs)}"
    if only_index:
        said += f"; {len(only_index)} of the index's are unknown to the peer, e.g. {only_index[:3]}"
    if only_peer:
        said += f"; {len(only_peer)} of the peer's are not in the index, e.g. {only_peer[:3]}"
    return said


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
        if not isinstance(self.index_fingerprint, str):
            raise PeerFusionError(
                f"the fusion's index_fingerprint is a string, got {self.index_fingerprint!r:.60}"
            )
        if not isinstance(self.fitted_on, dict):
            raise PeerFusionError(f"the fusion's fitted_on is a dict, got {self.fitted_on!r:.60}")

    def describe(self) -> str:
        """One line: the peer, the weight and what it was chosen on."""
        line = f"peer fusion: log p_model + {self.weight:g} log p_SASRec over the top {self.depth}"
        users = self.fitted_on.get("users")
        return line + (f" (weight chosen on {users} validation users)" if users else "")

    def check_index(self, index: Any, where: str, fix: str | None = None) -> None:
        """Refuse an index other than the one the peer was fitted for (fingerprint, items and their order).
        ``where``: the fusion's place in a message (``the folder 'DIR'``); ``fix``: what to do about it
        (default: fit the fusion again on this index, or delete its files)."""
        fix = fix or (
            "fit it again on this index (peft-grounded fuse-peer --adapter DIR --sid_index SID_INDEX), or "
            f"delete {', '.join(FUSION_FILES[:-1])} and {FUSION_FILES[-1]} from the adapter's folder"
        )
        if index.fingerprint() != self.index_fingerprint:
            raise PeerFusionError(
                f"the peer fusion in {where} was fitted for SID index {self.index_fingerprint}, not for this "
                f"one ({index.fingerprint()}); {fix}"
            )
        difference = item_difference(self.peer.item_ids, index.item_ids)
        if difference:
            raise PeerFusionError(
                f"the peer in {where} was fitted on other items than the SID index {index.fingerprint()} "
                f"({difference}); {fix}"
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
        fix = stored_fix(folder)
        record = _checked_record(read_json(folder / FUSION_JSON, fix=fix), folder / FUSION_JSON, fix)
        try:
            peer_record = (folder / FUSION_FILES[1]).read_bytes()
        except FileNotFoundError:
            raise PeerFusionError(f"{folder} has {FUSION_JSON} but no {FUSION_FILES[1]}; {fix}") from None
        if hashlib.sha256(peer_record).hexdigest() != record["peer_sha256"]:
            raise PeerFusionError(
                f"{folder / FUSION_FILES[1]} is not the peer {FUSION_JSON} was saved with; {fix}"
            )
        try:
            peer = SASRecRecommender.load(folder, fix=fix)
        except FileNotFoundError:
            raise PeerFusionError(f"{folder} has {FUSION_JSON} but no {FUSION_FILES[2]}; {fix}") from None
        except ValueError as err:  # names the file and the fix
            raise PeerFusionError(str(err)) from None
        return cls(
            peer,
            record["weight"],
            record["sid_index_fingerprint"],
            depth=record["depth"],
            fitted_on=record["fitted_on"],
        )


def _checked_record(record: Any, path: Path, fix: str) -> dict[str, Any]:
    """``peer_fusion.json``'s record, each field checked: a missing, unknown or mistyped one is named."""
    if not isinstance(record, dict):
        raise PeerFusionError(f"{path} holds a JSON {type(record).__name__}, not a peer fusion; {fix}")
    if "format" in record and record["format"] != FORMAT:
        raise PeerFusionError(
            f"{path} has format {record['format']!r:.40}; this version reads format {FORMAT}: {fix}"
        )
    missing = [name for name in FUSION_FIELDS if name not in record]
    extra = [name for name in record if name not in FUSION_FIELDS]
    if missing or extra:
        raise PeerFusionError(f"{path}: missing fields {missing}, unknown fields {extra}; {fix}")
    for name, (wanted, check) in FUSION_FIELDS.items():
        if not check(record[name]):
            raise PeerFusionError(f"{path}: field {name!r} is {record[name]!r:.60}, not {wanted}; {fix}")
    return record


__all__ = [
    "FUSION_FILES",
    "REFERENCE_WEIGHT",
    "PeerFusion",
    "PeerFusionError",
    "item_difference",
    "peer_log_probs",
    "product_of_experts",
]
