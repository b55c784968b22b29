"""The new-item rule stored with an adapter: items added after the adapter was trained (``add-items`` /
``grow-adapter``) served by :class:`~.mixture.SemanticMixture`, fitted on the
interactions logged since training.

Two files beside ``adapter_config.json``: ``new_item_rule.json`` (mode, temperature, logistic weights, the
new items, the SID index fingerprint it was fitted on, the sha256 of the vectors file) and
``new_item_rule.safetensors`` (one unit text vector per item of the index). No pickle.

The shipped mode is ``"share"``: the model's own list keeps its first ``k - round(k * pi_u)`` places and the
rest go to the new items of highest ``p_text``. ``"probability"`` (one ranking by the mixture probability)
wins more new-item hits but on Office cost the users whose target is an old item some Recall against the
model alone, while ``"share"`` kept them whole; see BENCHMARKS.md, "New items (Office)".

Whose list the rule mixes (``beams``) is chosen on the logged interactions too
(:meth:`NewItemRule.choose_beams`, which ``GroundedRecommender.fit_new_items`` and ``grow-adapter
--interactions`` call): the model's beams, or text KNN over all items where that serves the logged next
items better with a paired interval above 0. An undertrained model loses to text KNN (Office after 100
SFT steps: BENCHMARKS.md, "New items: the served rule against its controls"); then the rule says so and
serves the text.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..hub.repo import RULE_FILES

RULE_JSON, RULE_TENSORS = RULE_FILES
DEFAULT_MODE = "share"
MODES = ("share", "probability")
BEAMS = ("model", "text")  # whose list the rule mixes: the model's beams, or text KNN over all items
FORMAT = 1
N_WEIGHTS = 3  # the logistic prior's weights: bias, last item new, share of new items among the last five
# model_weight's bound: lam * log p_model stays within float range and beside the text's logits (the fitted grid,
# mixture.MODEL_WEIGHTS, runs from 0 to 2); far above it the product's softmax is the model's alone, or NaN
MODEL_WEIGHT_MAX = 10.0


class NewItemRuleError(ValueError):
    """A new-item rule that cannot be fitted or used as given; the message names the fix."""


def _number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _ids(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(i, str) for i in value)


RULE_FIELDS = {  # field of new_item_rule.json -> (what it must be, its check)
    "format": ("the integer 1", lambda v: v == FORMAT and not isinstance(v, bool)),
    "mode": (f"one of {MODES}", lambda v: v in MODES),
    "beams": (f"one of {BEAMS}", lambda v: v in BEAMS),
    "sid_index_fingerprint": ("a string", lambda v: isinstance(v, str)),
    "temperature": ("a positive number", lambda v: _number(v) and v > 0),
    "weights": (
        f"a list of {N_WEIGHTS} numbers",
        lambda v: isinstance(v, list) and len(v) == N_WEIGHTS and all(_number(w) for w in v),
    ),
    "decay": ("a number", _number),
    "window": ("a positive integer", lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0),
    "item_ids": ("a list of item ids", _ids),
    "new_items": ("a list of item ids", _ids),
    "fitted_on": ("an object", lambda v: isinstance(v, dict)),
    "vectors_sha256": ("a sha256 hex string", lambda v: isinstance(v, str) and len(v) == 64),
    "min_places": ("an integer >= 0", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0),
    "model_weight": (
        f"a number between 0 and {MODEL_WEIGHT_MAX:g}",
        lambda v: _number(v) and 0 <= v <= MODEL_WEIGHT_MAX,
    ),
}


def _checked_record(record: Any, path: Path, fix: str) -> dict[str, Any]:
    """``new_item_rule.json``'s record, each field checked: a missing, unknown or mistyped one is named."""
    if not isinstance(record, dict):
        raise NewItemRuleError(f"{path} holds a JSON {type(record).__name__}, not a new-item rule; {fix}")
    if "format" in record and record["format"] != FORMAT:
        raise NewItemRuleError(f"{path} is not a new-item rule of format {FORMAT}; {fix}")
    missing = [name for name in RULE_FIELDS if name not in record]
    extra = [name for name in record if name not in RULE_FIELDS]
    if missing or extra:
        raise NewItemRuleError(f"{path}: missing fields {missing}, unknown fields {extra}; {fix}")
    for name, (wanted, check) in RULE_FIELDS.items():
        if not check(record[name]):
            raise NewItemRuleError(f"{path}: field {name!r} is {record[name]!r:.60}, not {wanted}; {fix}")
    return record


def _check_model_weight(value: Any) -> None:
    if not (_number(value) and 0 <= value <= MODEL_WEIGHT_MAX):
        raise NewItemRuleError(
            f"model_weight={value!r}: give a number between 0 and {MODEL_WEIGHT_MAX:g} (0: the text alone; "
            "choose_model_weight fits it between 0 and 2)"
        )


def quantised_vector(index: Any, item: str) -> np.ndarray:
    """The item's point in the quantiser's space: the sum of its codebook vectors (the k-means levels)."""
    codes = index.sid_of(item)
    codes = codes[: len(index.codebooks)]  # the disambiguation code has no codebook
    return sum(
        np.asarray(book[code], dtype=np.float64) for book, code in zip(index.codebooks, codes, strict=True)
    )


def index_vectors(index: Any) -> np.ndarray:
    """``[items, dim]``: each item's point in the quantiser's space (the sum of its codebook vectors), the
    text vectors' reconstruction that every SID index carries."""
    return np.stack([quantised_vector(index, item) for item in index.item_ids]).astype(np.float32)


def rule_vectors(index: Any, catalogue: Any = None) -> np.ndarray:
    """``[items, dim]``: the vectors of the rule's text expert, one per item of ``index``. A text index: its own
    (:func:`index_vectors`). An index built from behaviour (or a mix): the items' text encoded with the
    index's encoder and text template, read from ``catalogue``, because the behaviour vectors of the items
    the rule serves (new or cold) come from a weak text-to-behaviour map; without a catalogue it warns and
    falls back to the index's own vectors."""
    if getattr(index, "vector_map", None) is None:
        return index_vectors(index)
    if catalogue is None:
        import warnings

        warnings.warn(
            "this SID index was built from behaviour vectors, and the new-item rule then ranks the items it "
            "serves by their text-mapped behaviour vectors, which rank them worse than their text; pass the "
            "catalogue so that the rule encodes the items' text (recommend --interactions FILE --catalogue "
            "CATALOGUE, or catalogue= of NewItemRule.fit and GroundedRecommender)",
            UserWarning,
            stacklevel=3,
        )
        return index_vectors(index)
    from ..sids import as_catalogue

    return index.text_vectors(as_catalogue(catalogue))


def calibration_pairs(histories: Iterable[Sequence[str]], index: Any) -> list[tuple[tuple[str, ...], str]]:
    """``(history, next item)`` from each logged history of two or more items: its last item is the one
    logged since training. Items the index does not hold are refused by name."""
    pairs, unknown = [], []
    for history in histories:
        history = tuple(str(i) for i in history)
        unknown += [i for i in history if i not in index]
        if len(history) >= 2:
            pairs.append((history[:-1], history[-1]))
    if unknown:
        raise NewItemRuleError(
            f"{len(set(unknown))} items of the logged interactions are not in the SID index (e.g. "
            f"{sorted(set(unknown))[:5]}); pass the grown index that holds them (add-items), or drop them"
        )
    if not pairs:
        raise NewItemRuleError(
            "the logged interactions hold no history of two or more items: the rule is fitted on (history, next "
            "item) pairs; log at least one user with two interactions"
        )
    return pairs


@dataclass
class NewItemRule:
    """The mixture and how it serves (``mode``), for the SID index of fingerprint ``index_fingerprint``."""

    mixture: Any  # SemanticMixture
    index_fingerprint: str
    mode: str = DEFAULT_MODE
    fitted_on: dict[str, Any] = field(default_factory=dict)
    beams: str = "model"
    min_places: int = 0  # share mode: the rule's items get at least this many places of each list
    model_weight: float = 0.0  # lam of p_text x p_model^lam over the new items (0: the text alone)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise NewItemRuleError(f"mode={self.mode!r}: choose one of {', '.join(MODES)}")
        if isinstance(self.min_places, bool) or not isinstance(self.min_places, int) or self.min_places < 0:
            raise NewItemRuleError(f"min_places={self.min_places!r}: give an integer >= 0 (0: pi_u alone)")
        if self.min_places and self.mode != "share":
            raise NewItemRuleError(
                f"min_places={self.min_places} reserves places in the share mode; mode={self.mode!r} ranks every "
                "candidate by one probability: use mode='share' or min_places=0"
            )
        if self.beams not in BEAMS:
            raise NewItemRuleError(f"beams={self.beams!r}: choose one of {', '.join(BEAMS)}")
        _check_model_weight(self.model_weight)
        if self.model_weight and self.beams != "model":
            raise NewItemRuleError(
                f"model_weight={self.model_weight} weighs the model's probabilities of the new items, and this "
                "rule serves text KNN's beams (beams='text'): set model_weight=0"
            )

    @property
    def new_items(self) -> list[str]:
        return list(self.mixture.new_items)

    @classmethod
    def fit(
        cls,
        index: Any,
        interactions: Iterable[Sequence[str]],
        *,
        new_items: Sequence[str] | None = None,
        vectors: np.ndarray | None = None,
        mode: str = DEFAULT_MODE,
        min_places: int = 0,
        catalogue: Any = None,
    ) -> NewItemRule:
        """Fit on logged ``interactions`` (each user's items in time order, the last one logged since
        training). ``new_items``: default the index's last growth (``index.added_items()``); any items the
        model cannot rank may be given instead, e.g. the cold ones (trained at most once); ``vectors``:
        one text vector per item of the index, default :func:`rule_vectors` (``catalogue``: the items' text,
        which an index built from behaviour needs); ``min_places``: see the class."""
        from .mixture import SemanticMixture

        new_items = list(index.added_items() if new_items is None else new_items)
        if not new_items:
            raise NewItemRuleError(
                "the SID index added no items since its parent: there is nothing for a new-item rule to serve "
                "(grow the index with `peft-grounded add-items` first)"
            )
        vectors = rule_vectors(index, catalogue) if vectors is None else np.asarray(vectors, dtype=np.float32)
        pairs = calibration_pairs(interactions, index)
        mixture = SemanticMixture.fit(list(index.item_ids), vectors, new_items, pairs)
        new = set(new_items)
        fitted = {"pairs": len(pairs), "pairs_with_new_item": sum(t in new for _, t in pairs)}
        return cls(mixture, index.fingerprint(), mode, fitted, min_places=min_places)

    def choose_beams(
        self,
        model_beams: Any,
        histories: Sequence[Sequence[str]],
        targets: Sequence[str],
        k: int = 10,
        *,
        resamples: int = 2000,
        seed: int = 0,
    ) -> dict[str, Any]:
        """Choose whose list this rule mixes, on logged ``(history, next item)`` pairs: ``model_beams`` (the
        model's :class:`~peft_grounded.decoding.Recommendations` for ``histories``) or text KNN over all
        items (:meth:`SemanticMixture.text_beams`). Text wins only where its Recall@``k`` of the logged next
        items is higher with a paired 95% bootstrap interval above 0; the model stays otherwise. Sets
        :attr:`beams` and returns (and records in :attr:`fitted_on`) both recalls and the interval."""
        from ..intervals import bootstrap_interval

        histories = [list(h) for h in histories]
        if not histories or len(histories) != len(targets) or len(model_beams.items) != len(histories):
            raise NewItemRuleError(
                f"choose_beams needs one logged next item and one model list per history: got "
                f"{len(histories)} histories, {len(targets)} targets, {len(model_beams.items)} lists"
            )
        width = max(model_beams.num_beams, k)
        hits = {}
        for beams, recs in (("model", model_beams), ("text", self.mixture.text_beams(histories, width))):
            lists = self.apply(recs, histories, k).items
            hits[beams] = np.array([t in lst[:k] for lst, t in zip(lists, targets, strict=True)], dtype=float)
        difference = hits["text"] - hits["model"]
        found = bootstrap_interval([difference], resamples=resamples, seed=seed)
        self.beams = "text" if found["low"] > 0 else "model"
        choice = {
            "beams": self.beams,
            "choice_pairs": len(histories),
            "choice_k": k,
            "choice_recall_model": float(hits["model"].mean()),
            "choice_recall_text": float(hits["text"].mean()),
            "choice_text_minus_model_ci95": [float(found["low"]), float(found["high"])],
        }
        self.fitted_on = {**self.fitted_on, **choice}
        return choice

    def choose_model_weight(
        self, new_item_beams: Any, histories: Sequence[Sequence[str]], targets: Sequence[str]
    ) -> dict[str, Any]:
        """Fit :attr:`model_weight` on logged ``(history, next item)`` pairs (held out of any training of the
        rows): :meth:`SemanticMixture.fit_model_weight` with ``new_item_beams``, the model's search over the
        new items alone for ``histories``. Stays 0 where the rule serves text KNN's beams, or where no pair
        goes to a new item. Returns (and records in :attr:`fitted_on`) the weight and its table."""
        if len(new_item_beams.items) != len(histories) or len(targets) != len(histories):
            raise NewItemRuleError(
                f"choose_model_weight needs one new-item list and one next item per history: got "
                f"{len(histories)} histories, {len(targets)} targets, {len(new_item_beams.items)} lists"
            )
        table: list[dict[str, float]] = []
        if self.beams == "model" and any(t in set(self.new_items) for t in targets):
            self.model_weight, table = self.mixture.fit_model_weight(histories, targets, new_item_beams)
        choice = {"model_weight": self.model_weight, "model_weight_table": table}
        self.fitted_on = {**self.fitted_on, **choice}
        return choice

    def describe(self) -> str:
        """One line: what the rule was fitted on and whose beams it mixes (with the choice's figures)."""
        fitted = self.fitted_on
        line = (
            f"new-item rule ({self.mode} mode) fitted on {fitted.get('pairs', '?')} logged pairs "
            f"({fitted.get('pairs_with_new_item', '?')} to a new item), {len(self.new_items)} new items"
            + (f" given at least {self.min_places} places" if self.min_places else "")
            + "; "
            f"mixing the {'model' if self.beams == 'model' else 'text KNN'} beams"
            + (f", new items by p_text x p_model^{self.model_weight:g}" if self.model_weight else "")
        )
        if "choice_k" in fitted:
            low, high = fitted["choice_text_minus_model_ci95"]
            line += (
                f" (Recall@{fitted['choice_k']} of {fitted['choice_pairs']} logged next items: model "
                f"{fitted['choice_recall_model']:.3f}, text KNN {fitted['choice_recall_text']:.3f}, "
                f"text - model [{low:+.3f}, {high:+.3f}])"
            )
        return line

    def check_index(self, index: Any, where: str) -> None:
        """Refuse an index other than the one the rule was fitted on (its fingerprint, and its items: the
        rule's item list is not covered by the vectors' checksum)."""
        fix = (
            "fit it again on this index (grow-adapter --interactions FILE, or recommend --interactions FILE)"
        )
        if index.fingerprint() != self.index_fingerprint:
            raise NewItemRuleError(
                f"the new-item rule in {where} was fitted on SID index {self.index_fingerprint}, not on this one "
                f"({index.fingerprint()}); {fix}"
            )
        ours, theirs = list(self.mixture.item_ids), [str(i) for i in index.item_ids]
        if ours != theirs:
            other = sorted(set(ours) ^ set(theirs))
            listed = (
                f"other items than its SID index {self.index_fingerprint} (e.g. {other[:3]})"
                if other
                else f"the items of its SID index {self.index_fingerprint} in another order"
            )
            raise NewItemRuleError(
                f"the new-item rule in {where} lists {listed}: it was edited or damaged; {fix}"
            )

    def apply(
        self, recommendations: Any, histories: Sequence[Sequence[str]], k: int, new_item_beams: Any = None
    ) -> Any:
        """The lists served: :meth:`SemanticMixture.mix` in this rule's mode (history items left out), each
        filled up to ``k`` with the model's next items where the new items ran out (``share`` gives a user
        ``round(k * pi_u)`` places however few new items are left), scored as the mixture scores a model
        item, ``log(1 - pi_u) + log p_model``. ``new_item_beams``: the model's search over the new items
        alone (:func:`~.beams.new_item_beams`), needed where :attr:`model_weight` > 0."""
        histories = [list(h) for h in histories]
        _check_model_weight(self.model_weight)  # set after the rule was made, perhaps
        if self.model_weight and new_item_beams is None:
            raise NewItemRuleError(
                f"this rule ranks new items by p_text x p_model^{self.model_weight:g}: give the model's search "
                "over the new items (new_item_beams; serving.top_k_lists decodes it)"
            )
        mixed = self.mixture.mix(
            recommendations,
            histories,
            k,
            mode=self.mode,
            min_places=self.min_places,
            new_item_beams=new_item_beams,
            model_weight=self.model_weight,
        )
        priors = mixed.extra["new_item_prior"]
        for u, (items, scores) in enumerate(zip(mixed.items, mixed.scores, strict=True)):
            taken = set(items) | set(histories[u])
            share = math.log(max(1.0 - priors[u], 1e-12))
            for item, score in zip(recommendations.items[u], recommendations.scores[u], strict=True):
                if len(items) >= k:
                    break
                if item not in taken and math.isfinite(score):
                    items.append(item)
                    scores.append(share + score)
                    taken.add(item)
        return mixed

    def save(self, folder: str | Path) -> list[Path]:
        """Write the two files into ``folder`` (each atomically; the JSON, written last, names the vectors'
        sha256, so a reader never pairs it with other vectors)."""
        from safetensors.numpy import save

        from .._io import atomic_write, atomic_write_text

        m = self.mixture
        tensors = save({"vectors": np.ascontiguousarray(m.vectors, dtype=np.float32)})
        record = {
            "format": FORMAT,
            "mode": self.mode,
            "beams": self.beams,
            "sid_index_fingerprint": self.index_fingerprint,
            "temperature": float(m.temperature),
            "weights": [float(w) for w in m.weights],
            "decay": float(m.decay),
            "window": int(m.window),
            "item_ids": list(m.item_ids),
            "new_items": list(m.new_items),
            "fitted_on": self.fitted_on,
            "vectors_sha256": hashlib.sha256(tensors).hexdigest(),
            "min_places": self.min_places,
            "model_weight": float(self.model_weight),
        }
        folder = Path(folder)
        return [
            atomic_write(folder / RULE_TENSORS, tensors),
            atomic_write_text(folder / RULE_JSON, json.dumps(record, indent=1) + "\n"),
        ]

    @classmethod
    def load(cls, folder: str | Path) -> NewItemRule | None:
        """The rule saved in ``folder``, or ``None`` when it holds none."""
        from safetensors.numpy import load

        from .._io import read_json
        from .mixture import SemanticMixture

        folder = Path(folder)
        if not (folder / RULE_JSON).is_file():
            return None
        fix = f"fit it again (grow-adapter --interactions FILE) or delete {RULE_JSON} and {RULE_TENSORS}"
        record = _checked_record(read_json(folder / RULE_JSON, fix=fix), folder / RULE_JSON, fix)
        try:
            data = (folder / RULE_TENSORS).read_bytes()
        except FileNotFoundError:
            raise NewItemRuleError(f"{folder} has {RULE_JSON} but no {RULE_TENSORS}; {fix}") from None
        if hashlib.sha256(data).hexdigest() != record["vectors_sha256"]:
            raise NewItemRuleError(
                f"{folder / RULE_TENSORS} is not the file {RULE_JSON} was saved with; {fix}"
            )
        try:
            vectors = load(data)["vectors"]
        except Exception as err:  # a file whose sha256 matches yet is no safetensors: written so by hand
            raise NewItemRuleError(f"{folder / RULE_TENSORS} is not readable ({err}); {fix}") from None
        if vectors.ndim != 2 or len(vectors) != len(record["item_ids"]) or not np.isfinite(vectors).all():
            raise NewItemRuleError(
                f"{folder / RULE_TENSORS} holds vectors of shape {tuple(vectors.shape)} for "
                f"{len(record['item_ids'])} items, or non-finite values; {fix}"
            )
        try:
            mixture = SemanticMixture(
                record["item_ids"],
                vectors,
                record["new_items"],
                temperature=record["temperature"],
                weights=np.asarray(record["weights"], dtype=np.float64),
                decay=record["decay"],
                window=record["window"],
            )
            return cls(
                mixture,
                record["sid_index_fingerprint"],
                record["mode"],
                record["fitted_on"],
                record["beams"],
                record["min_places"],
                record["model_weight"],
            )
        except (ValueError, TypeError) as err:
            raise NewItemRuleError(f"{folder / RULE_JSON}: {err}; {fix}") from None
