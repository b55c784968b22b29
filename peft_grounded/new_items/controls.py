"""The new-item protocol's controls of the served rule, and its all-users interval.

The served rule (:class:`~.rule.NewItemRule`, what ``evaluate`` and ``recommend`` serve through
:func:`peft_grounded.serving.top_k_lists`) mixes the model's beams with the new items' text. Two controls
say whether the model's beams add anything for new-item users:

* the *text-only mixture* (:data:`TEXT_ONLY`): the same rule over text KNN beams over ALL items
  (:func:`text_knn_beams`) in place of the LLM's;
* the new items by ``p_text`` alone (:data:`P_TEXT`, :func:`p_text_lists`): no model at all.

The slot rule and random slots (:mod:`.slots`) are the controls of the earlier rule. :func:`blended` gives
a rule's value over all users as the population holds them (new-item and old-item users weighted by their
shares) with a stratified bootstrap interval.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..decoding import Recommendations

TEXT_ONLY = "text-only mixture (control)"
P_TEXT = "new items by p_text alone (control)"


def text_knn_beams(mixture: Any, histories: Sequence[Sequence[str]], beams: int) -> Recommendations:
    """The LLM's beams replaced by text KNN over ALL items (:meth:`~.mixture.SemanticMixture.text_beams`:
    each user's ``beams`` items nearest their recency profile, history items left out, a log-softmax of
    ``cos / temperature``), so the mixture gets a text "model" in place of the LLM."""
    return mixture.text_beams(histories, beams)


def p_text_lists(mixture: Any, histories: Sequence[Sequence[str]], k: int) -> list[list[str]]:
    """The new items ranked by ``p_text`` alone (no model): each user's top ``k`` new items."""
    text = mixture.text_probabilities(histories)
    order = np.argsort(-text, axis=1, kind="stable")[:, :k]
    return [[mixture.new_items[j] for j in user if text[u, j] > 0] for u, user in enumerate(order)]


def control_lists(
    mixture: Any, histories: Sequence[Sequence[str]], k: int, beams: int, mode: str
) -> dict[str, list[list[str]]]:
    """The two controls of the served rule (``mode``): the same rule over text KNN beams, and p_text alone."""
    from .rule import NewItemRule

    rule = NewItemRule(mixture, "control", mode)
    return {
        TEXT_ONLY: rule.apply(text_knn_beams(mixture, histories, beams), histories, k).items,
        P_TEXT: p_text_lists(mixture, histories, k),
    }


def blended(
    new: np.ndarray, old: np.ndarray, weight: float, seed: int, rounds: int
) -> tuple[float, float, float]:
    """``weight * mean(new) + (1 - weight) * mean(old)`` (``weight``: the new-item users' share of all users)
    and its 95% stratified bootstrap interval (each group's users resampled within the group)."""
    rng = np.random.default_rng(seed)
    value = weight * new.mean() + (1 - weight) * old.mean()
    draws = weight * new[rng.integers(0, len(new), (rounds, len(new)))].mean(1)
    draws += (1 - weight) * old[rng.integers(0, len(old), (rounds, len(old)))].mean(1)
    return float(value), float(np.percentile(draws, 2.5)), float(np.percentile(draws, 97.5))
