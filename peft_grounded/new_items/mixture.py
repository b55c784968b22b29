"""New items served by calibrated probability: the model's beams for the items it knows, the item texts'
semantics for the items nobody has interacted with yet.

A model trained before an item existed cannot rank it well, however good its SID tokens' starting rows:
beam search follows the transitions it learnt, and a new item has none. What a new item does have is the
text vector its SID was quantised from. This rule ranks every candidate of a user ``u`` by one
probability, a two-expert mixture::

    p(i | u) = (1 - pi_u) * p_model(i | u) + pi_u * p_text(i | u)

* ``p_model``: the model's probability of the item's SID (the beam score, a summed log-probability);
* ``p_text``: a softmax over the *new* items of ``cos(v_i, profile_u) / temperature``, where
  ``profile_u`` is the user's recency-weighted text profile (history items excluded); with a
  ``model_weight`` ``lam`` > 0, of ``cos / temperature + lam * log p_model(i | u)``, the model's own
  probability of each new item from a search over the new items alone (a product of the two experts: a
  model whose new rows were tuned on the log knows which new items a user goes to, the text what they are);
* ``pi_u``: the probability that ``u``'s next item is a new one, a logistic model of the history (is
  the last item new, the share of new items among the last five, a bias).

Two ways to serve it (``mode``):

* ``"probability"``: every candidate ranked by ``p(i | u)``: the most expected hits over all users, at
  the price of users who stay with old items when the model is weak (its probabilities are then small);
* ``"share"``: the model's own list keeps its first ``k - round(k * pi_u)`` places, in its order, and the
  remaining places go to the new items of highest mixture probability (with a ``model_weight``, of highest
  ``p_text x p_model^lam``, which holds the model's view of the new items already): a user unlikely to pick
  a new item keeps almost all of the model's list.

``temperature`` and the logistic weights are fitted by maximum likelihood on *calibration* examples: the
interactions logged since the model was trained, typically each user's most recent one (the validation
position when the test position is scored). They never see the scored targets. Nothing trains the LLM:
this is a serving rule over the beams the search already returned, plus one matrix product per user.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..decoding import Recommendations

RECENT = 5  # the last items whose share of new items is a feature of pi_u
MODEL_WEIGHTS = (0.0, 0.1, 0.25, 0.5, 1.0, 2.0)  # the grid lam is fitted on


@dataclass
class SemanticMixture:
    """The calibrated mixture; build it with :meth:`fit`."""

    item_ids: list[str]
    vectors: np.ndarray  # [items, d], unit rows (every item: old items appear in profiles)
    new_items: list[str]
    temperature: float = 0.05
    weights: np.ndarray = field(default_factory=lambda: np.zeros(3))  # logistic: bias, last new, share new
    decay: float = 0.7
    window: int = 20

    def __post_init__(self) -> None:
        vectors = np.asarray(self.vectors, dtype=np.float32)
        if vectors.ndim != 2 or len(vectors) != len(self.item_ids):
            raise ValueError(f"one vector per item: got {vectors.shape} for {len(self.item_ids)} items")
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        if not np.isfinite(vectors).all() or (norms == 0).any():
            raise ValueError("item vectors must be finite and non-zero (re-encode the catalogue)")
        self.vectors = vectors / norms
        self._row = {item: r for r, item in enumerate(self.item_ids)}
        missing = [i for i in self.new_items if i not in self._row]
        if missing:
            raise ValueError(f"{len(missing)} new items have no vector (e.g. {missing[:3]})")
        if not self.new_items:
            raise ValueError("no new items to serve: the index added none since the model was trained")
        self._new = set(self.new_items)
        self._new_rows = np.array([self._row[i] for i in self.new_items])
        self._column = {item: j for j, item in enumerate(self.new_items)}  # a new item's column of p_text
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")

    # ------------------------------------------------------------------ the two experts' inputs

    def features(self, histories: Sequence[Sequence[str]]) -> np.ndarray:
        """``[n, 3]``: bias, whether the last item is new, the share of new items among the last five."""
        out = np.zeros((len(histories), 3), dtype=np.float64)
        out[:, 0] = 1.0
        for u, history in enumerate(histories):
            if history:
                out[u, 1] = float(history[-1] in self._new)
                recent = history[-RECENT:]
                out[u, 2] = sum(i in self._new for i in recent) / len(recent)
        return out

    def new_item_prior(self, histories: Sequence[Sequence[str]]) -> np.ndarray:
        """``pi_u``: the probability that each user's next item is a new one."""
        return 1.0 / (1.0 + np.exp(-self.features(histories) @ self.weights))

    def _profiles(self, histories: Sequence[Sequence[str]]) -> np.ndarray:
        """``[n, d]``: each history's recency profile (the last ``window`` items, weights ``decay ** age``),
        unit length (zero for a history of no known item)."""
        profiles = np.zeros((len(histories), self.vectors.shape[1]), dtype=np.float32)
        for u, history in enumerate(histories):
            rows = [self._row[i] for i in history if i in self._row][-self.window :]
            if rows:
                w = self.decay ** np.arange(len(rows) - 1, -1, -1, dtype=np.float32)
                profile = w @ self.vectors[rows]
                profiles[u] = profile / max(float(np.linalg.norm(profile)), 1e-12)
        return profiles

    def _cosines(self, histories: Sequence[Sequence[str]]) -> np.ndarray:
        """``[n, new items]`` cosines to each history's recency profile, history items at ``-inf``."""
        cos = self._profiles(histories) @ self.vectors[self._new_rows].T
        for u, history in enumerate(histories):
            seen = [self._column[i] for i in history if i in self._column]
            if seen:
                cos[u, seen] = -np.inf
        return cos

    def model_log_probs(self, new_item_beams: Recommendations) -> np.ndarray:
        """``[n, new items]``: each list's log-probabilities of the new items (a search over the new items
        alone); an item outside a list gets that list's lowest (0 for an empty list)."""
        column = self._column
        out = np.zeros((len(new_item_beams.items), len(self.new_items)))
        for u, (items, scores) in enumerate(zip(new_item_beams.items, new_item_beams.scores, strict=True)):
            known = [(column[str(i)], s) for i, s in zip(items, scores, strict=True) if str(i) in column]
            if known:
                out[u] = min(s for _, s in known)
                out[u, [j for j, _ in known]] = [s for _, s in known]
        return out

    def text_log_probabilities(
        self,
        histories: Sequence[Sequence[str]],
        new_item_beams: Recommendations | None = None,
        model_weight: float = 0.0,
    ) -> np.ndarray:
        """``log p_text``: ``[n, new items]``, each row a log-softmax of the cosines over the temperature,
        plus ``model_weight`` times the model's log-probabilities (:meth:`model_log_probs` of
        ``new_item_beams``) where ``model_weight`` > 0; the history's items at -inf."""
        logits = self._cosines(histories) / self.temperature
        if model_weight > 0:
            if new_item_beams is None or len(new_item_beams.items) != len(histories):
                raise ValueError(
                    f"model_weight={model_weight} weighs the model's probabilities of the new items: give "
                    "one list of new-item beams per history (new_items.new_item_beams)"
                )
            logits = logits + model_weight * self.model_log_probs(new_item_beams)
        logits -= logits.max(axis=1, keepdims=True)
        return logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))

    def text_probabilities(
        self,
        histories: Sequence[Sequence[str]],
        new_item_beams: Recommendations | None = None,
        model_weight: float = 0.0,
    ) -> np.ndarray:
        """``p_text``: the exponent of :meth:`text_log_probabilities`."""
        return np.exp(self.text_log_probabilities(histories, new_item_beams, model_weight))

    def fit_model_weight(
        self,
        histories: Sequence[Sequence[str]],
        targets: Sequence[str],
        new_item_beams: Recommendations,
        weights: Sequence[float] = MODEL_WEIGHTS,
    ) -> tuple[float, list[dict[str, float]]]:
        """The weight of ``weights`` maximising the mean log-probability of the held-out pairs' new next
        items (pairs whose next item is old are left out), and the table behind it. As the temperature,
        fitted by likelihood: far steadier than a recall on the few pairs that go to a new item."""
        keep = [u for u, t in enumerate(targets) if t in self._new and t not in set(histories[u])]
        if not keep:
            raise ValueError("none of the held-out pairs goes to a new item: the model's weight needs some")
        chosen = [list(histories[u]) for u in keep]
        beams = replace(
            new_item_beams,
            items=[new_item_beams.items[u] for u in keep],
            scores=[new_item_beams.scores[u] for u in keep],
        )
        column = np.array([self._column[targets[u]] for u in keep])
        table = []
        for weight in sorted({0.0, *(float(w) for w in weights)}):
            log_p = self.text_log_probabilities(chosen, beams, weight)
            table.append(
                {"weight": weight, "log_likelihood": float(log_p[np.arange(len(keep)), column].mean())}
            )
        best = max(
            table, key=lambda row: (round(row["log_likelihood"], 9), -row["weight"])
        )  # ties: less model
        return best["weight"], table

    def text_beams(
        self, histories: Sequence[Sequence[str]], beams: int, allowed: Any = None
    ) -> Recommendations:
        """Text KNN over ALL items (``allowed``: a container of the items that may be listed) in place of a
        model's beams: each history's ``beams`` items nearest its recency profile, history items left out,
        scored by a log-softmax of ``cos / temperature`` over the listable items."""
        logits = (self._profiles(histories) @ self.vectors.T) / self.temperature
        if allowed is not None:
            logits[:, [r for r, item in enumerate(self.item_ids) if item not in allowed]] = -np.inf
        for u, history in enumerate(histories):
            logits[u, [self._row[i] for i in history if i in self._row]] = -np.inf
        top = np.argsort(-logits, axis=1, kind="stable")[:, :beams]
        finite = np.isfinite(logits).any(axis=1, keepdims=True)
        peak = np.where(finite, logits.max(axis=1, keepdims=True), 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            log_p = logits - peak - np.log(np.exp(logits - peak).sum(axis=1, keepdims=True))
        items = [[self.item_ids[j] for j in user if np.isfinite(log_p[u, j])] for u, user in enumerate(top)]
        scores = [
            [float(log_p[u, j]) for j in user if np.isfinite(log_p[u, j])] for u, user in enumerate(top)
        ]
        return Recommendations(items=items, scores=scores, k=beams, num_beams=beams)

    # ------------------------------------------------------------------ calibration

    @classmethod
    def fit(
        cls,
        item_ids: list[str],
        vectors: np.ndarray,
        new_items: list[str],
        calibration: Sequence[tuple[Sequence[str], str]],
        **kwargs: Any,
    ) -> SemanticMixture:
        """Fit ``temperature`` and ``pi_u``'s weights on ``calibration`` pairs ``(history, next item)``:
        the next items seen since the model trained, never the targets being scored."""
        mixture = cls(item_ids, vectors, new_items, **kwargs)
        if not calibration:
            raise ValueError("calibration needs (history, next item) pairs logged since the model trained")
        histories = [list(h) for h, _ in calibration]
        is_new = np.array([t in mixture._new for _, t in calibration], dtype=np.float64)
        mixture.weights = _logistic(mixture.features(histories), is_new)
        with_new = [
            (h, t) for h, t in zip(histories, (t for _, t in calibration), strict=True) if t in mixture._new
        ]
        if with_new:
            cos = mixture._cosines([h for h, _ in with_new])
            target = np.array([mixture._column[t] for _, t in with_new])
            keep = np.isfinite(cos[np.arange(len(target)), target])
            mixture.temperature = _best_temperature(cos[keep], target[keep])
        return mixture

    # ------------------------------------------------------------------ serving

    def mix(
        self,
        recommendations: Recommendations,
        histories: Sequence[Sequence[str]],
        k: int | None = None,
        mode: str = "probability",
        min_places: int = 0,
        new_item_beams: Recommendations | None = None,
        model_weight: float = 0.0,
    ) -> Recommendations:
        """Top-``k`` lists (history items left out) by ``mode`` (see the module); ``scores`` hold the log of
        the mixture probability; ``extra["new_items_per_list"]`` counts new items per list and
        ``extra["new_item_prior"]`` holds ``pi_u``. ``min_places`` (``share`` only): the new items get at
        least this many of the ``k`` places, whatever ``pi_u``. ``new_item_beams``, ``model_weight``: see
        :meth:`text_probabilities`."""
        k = recommendations.k if k is None else k
        if len(histories) != len(recommendations.items):
            raise ValueError(f"{len(histories)} histories for {len(recommendations.items)} lists")
        if mode not in ("probability", "share"):
            raise ValueError(f"mode must be 'probability' or 'share', got {mode!r}")
        if min_places and mode != "share":
            raise ValueError(f"min_places={min_places} reserves places of the share mode, not of {mode!r}")
        prior = self.new_item_prior(histories)
        text = self.text_probabilities(histories, new_item_beams, model_weight)
        top = min(k, len(self.new_items))
        items_out: list[list[Hashable]] = []
        scores_out: list[list[float]] = []
        counts: list[int] = []
        for u, (items, scores) in enumerate(zip(recommendations.items, recommendations.scores, strict=True)):
            seen = set(histories[u])
            prob: dict[Hashable, float] = {}
            for item, score in zip(items, scores, strict=True):
                if str(item) not in seen and math.isfinite(score):
                    prob[item] = prob.get(item, 0.0) + (1.0 - prior[u]) * math.exp(score)
            for j in np.argpartition(-text[u], top - 1)[:top]:
                if text[u, j] > 0:
                    item = self.new_items[j]
                    prob[item] = prob.get(item, 0.0) + prior[u] * float(text[u, j])
            if mode == "share":
                quota = min(k, max(min_places, round(k * float(prior[u]))))
                model_items = [i for i in items if i in prob and str(i) not in self._new][: k - quota]
                order = prob  # the new places: by the mixture, or by the product where it holds the model
                if model_weight > 0:
                    order = {i: float(text[u, self._column[str(i)]]) for i in prob if str(i) in self._new}
                by_text = sorted(
                    (i for i in prob if str(i) in self._new and i not in model_items), key=lambda i: -order[i]
                )
                ranked = [(i, prob[i]) for i in model_items + by_text[: k - len(model_items)]]
            else:
                ranked = sorted(prob.items(), key=lambda kv: -kv[1])[:k]
            items_out.append([i for i, _ in ranked])
            scores_out.append([math.log(p) for _, p in ranked])
            counts.append(sum(str(i) in self._new for i, _ in ranked))
        extra = dict(recommendations.extra) | {"new_items_per_list": counts, "new_item_prior": prior.tolist()}
        return replace(recommendations, items=items_out, scores=scores_out, k=k, extra=extra)


def _logistic(x: np.ndarray, y: np.ndarray, l2: float = 1e-3, steps: int = 50) -> np.ndarray:
    """Weights of a logistic regression of ``y`` on ``x`` (Newton's method, a small ridge)."""
    w = np.zeros(x.shape[1])
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-x @ w))
        gradient = x.T @ (p - y) + l2 * w
        hessian = (x * (p * (1 - p))[:, None]).T @ x + l2 * np.eye(x.shape[1])
        step = np.linalg.solve(hessian, gradient)
        w -= step
        if np.abs(step).max() < 1e-8:
            break
    return w


def _best_temperature(cos: np.ndarray, target: np.ndarray) -> float:
    """The temperature maximising the mean log-softmax of the targets' cosines (a log-spaced grid)."""
    if not len(target):
        return 0.05
    best, best_ll = 0.05, -np.inf
    for t in np.geomspace(0.005, 1.0, 60):
        logits = cos / t
        finite = np.where(np.isfinite(logits), logits, -np.inf)
        m = finite.max(axis=1, keepdims=True)
        log_z = m[:, 0] + np.log(np.exp(finite - m).sum(axis=1))
        ll = float(np.mean(finite[np.arange(len(target)), target] - log_z))
        if ll > best_ll:
            best, best_ll = float(t), ll
    return best
