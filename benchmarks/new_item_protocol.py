"""The new-item protocol's logic: what ``bench_grow_protocol.py`` holds out and scores, and what it compares
the served rule with.

* its data: which items are new (the newest by first interaction), the users scored on them, their whole
  histories, and the pairs a serving side has logged since training (for calibration);
* the controls of the served rule (a text-only mixture, the new items by ``p_text`` alone) and the all-users
  stratified interval (:func:`blended`);
* TIGER's slot rule (:func:`mix_new_items`) and random slots (:func:`random_slots`), the earlier rule and its
  control.

``benchmarks/bench_grow_protocol.py`` runs the protocol (hold out the newest items, train on the rest, grow,
score the users whose target is new) with them, ``bench_cold_rule.py`` and ``compare_grow_protocol.py`` use
them too; they are tested without a model (``tests/test_bench_new_item_protocol.py``,
``tests/test_bench_new_item_slots.py``). The rule they measure is the package's
(:class:`peft_grounded.new_items.NewItemRule`, served by :func:`peft_grounded.serving.top_k_lists`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from peft_grounded.decoding import Recommendations
from peft_grounded.new_items.rule import NewItemRule, quantised_vector

if TYPE_CHECKING:
    from peft_grounded.sids.catalogue import LeaveOneOut


Example = tuple[str, tuple[str, ...], str]  # (user id, history, target), as LeaveOneOut gives them


def first_seen(catalogue: Any, dataset: str | Path) -> dict[str, float]:
    """Per item of ``catalogue``, the time of its first interaction: the RecBole timestamps of the first
    ``*.inter`` file in ``dataset`` (a folder; ``"movielens-100k"`` is the packaged MovieLens-100K) when it
    has a ``timestamp`` column, else a position proxy (the earliest relative position in a user's
    sequence). An item never seen gets ``inf``."""
    if str(dataset) == "movielens-100k":
        from peft_grounded import assets

        directory = assets.movielens_100k()
    else:
        directory = Path(dataset)
    inter = sorted(directory.glob("*.inter")) if directory.is_dir() else []
    if inter:
        stamps = _recbole_first_stamps(inter[0])
        if stamps is not None:
            return {i: stamps.get(i, math.inf) for i in catalogue.items}
    return position_first_seen(catalogue.items, catalogue.sequences.values())


def _recbole_first_stamps(path: Path) -> dict[str, float] | None:
    """Item id -> earliest timestamp of a RecBole ``.inter`` file; None where it has no timestamp column."""
    lines = path.read_text().splitlines()
    if not lines:
        raise ValueError(
            f"{path} is empty: a RecBole .inter file starts with a header line (item_id:token ...)"
        )
    header = [h.split(":")[0] for h in lines[0].split("\t")]
    if "timestamp" not in header:
        return None
    if "item_id" not in header:
        raise ValueError(
            f"{path} has no item_id column (header: {lines[0]!r}); RecBole files name it item_id"
        )
    i_item, i_time = header.index("item_id"), header.index("timestamp")
    seen: dict[str, float] = {}
    for number, line in enumerate(lines[1:], start=2):
        cells = line.split("\t")
        if len(cells) <= max(i_item, i_time):
            raise ValueError(f"{path}, line {number}: {len(cells)} cells, the header has {len(header)}")
        item, stamp = cells[i_item], float(cells[i_time])
        seen[item] = min(seen.get(item, math.inf), stamp)
    return seen


def position_first_seen(items: Iterable[str], sequences: Iterable[tuple[str, ...]]) -> dict[str, float]:
    """Per item, the earliest relative position (0 first, below 1) at which any sequence holds it."""
    seen: dict[str, float] = {}
    for seq in sequences:
        for pos, item in enumerate(seq):
            seen[item] = min(seen.get(item, math.inf), pos / max(len(seq), 1))
    return {i: seen.get(i, math.inf) for i in items}


def new_item_examples(split: LeaveOneOut, new: set[str], max_history: int, positions: str) -> list[Example]:
    """One scored example per user whose target is a new item: its test target (``positions="test"``),
    or, with ``"last-two"``, the test target when new, else the validation target when new (the history
    before it). No model trains on either position, so both are fair for the retrained reference too."""
    _check_positions(positions)
    chosen = {e[0]: e for e in split.test_examples(max_history) if e[2] in new}
    if positions == "last-two":
        for e in split.valid_examples(max_history):
            if e[2] in new and e[0] not in chosen:
                chosen[e[0]] = e
    return [chosen[u.user_id] for u in split.users if u.user_id in chosen]


def logged_pairs(split: LeaveOneOut, positions: str) -> list[tuple[tuple[str, ...], str]]:
    """``(history, next item)`` at the position before the scored one, for every user: what the serving
    side has logged since the model trained (what :meth:`~peft_grounded.new_items.NewItemRule.fit`
    calibrates on), never a scored target."""
    _check_positions(positions)
    if positions == "test":
        return [(u.history, u.valid) for u in split.users]
    return [(u.history[:-1], u.history[-1]) for u in split.users if len(u.history) > 1]


def full_histories(split: LeaveOneOut, examples: list[Example]) -> list[tuple[str, ...]]:
    """Each example's whole history before its target (the prompt shows only its last ``max_history``
    items): what the served route leaves out of the user's list and the new-item rule reads."""
    by_user = {u.user_id: u for u in split.users}
    out = []
    for user, _, target in examples:
        u = by_user[user]
        out.append(u.history if target == u.valid and target != u.test else (*u.history, u.valid))
    return out


def _check_positions(positions: str) -> None:
    if positions not in ("test", "last-two"):
        raise ValueError(f"positions={positions!r}: give 'test' or 'last-two'")


# The new-item protocol's controls of the served rule, and its all-users interval.
#
# The served rule (:class:`~peft_grounded.new_items.NewItemRule`, what ``evaluate`` and ``recommend`` serve
# through :func:`peft_grounded.serving.top_k_lists`) mixes the model's beams with the new items' text. Two
# controls say whether the model's beams add anything for new-item users:
#
# * the *text-only mixture* (:data:`TEXT_ONLY`): the same rule over text KNN beams over ALL items
#   (:func:`text_knn_beams`) in place of the LLM's;
# * the new items by ``p_text`` alone (:data:`P_TEXT`, :func:`p_text_lists`): no model at all.
#
# The slot rule and random slots (below) are the controls of the earlier rule. :func:`blended` gives
# a rule's value over all users as the population holds them (new-item and old-item users weighted by their
# shares) with a stratified bootstrap interval.

TEXT_ONLY = "text-only mixture (control)"
P_TEXT = "new items by p_text alone (control)"


def text_knn_beams(mixture: Any, histories: Sequence[Sequence[str]], beams: int) -> Recommendations:
    """The LLM's beams replaced by text KNN over ALL items
    (:meth:`~peft_grounded.new_items.SemanticMixture.text_beams`:
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


# New items in the top-K at once: slots for items that share a SID prefix with the model's picks.
#
# A model trained before an item existed has never seen its SID as a target, so beam search rarely reaches
# it, even when the item's first codes (its semantic region) are ones the model ranks highly. TIGER's
# cold-start rule (Rajput et al., 2023) serves such items anyway: a new item whose SID shares its first
# ``match_levels`` codes with an item the model generated takes that item's score, and at most
# ``share * k`` of the ``k`` slots go to new items. No training and no extra forward pass: it reads the
# beams the search already returned.
#
# The served new-item rule is :class:`~peft_grounded.new_items.NewItemRule` (what ``evaluate`` and ``recommend``
# serve); the slot rule is one of the new-item protocol's controls (``bench_grow_protocol.py``), beside
# :func:`random_slots`, the control of any new-item rule.


def default_match_levels(index: Any) -> int:
    """Every level but the last: the semantic codes when the last level is the disambiguation code."""
    return max(index.n_levels - 1, 1)


def nearest_first(index: Any, item: str, candidates: list[str]) -> list[str]:
    """``candidates`` ordered by the distance of their quantised vectors to ``item``'s (ties: given order)."""
    if len(candidates) < 2:
        return candidates
    anchor = quantised_vector(index, item)
    distance = {c: float(np.linalg.norm(quantised_vector(index, c) - anchor)) for c in candidates}
    return sorted(candidates, key=distance.__getitem__)


def mix_new_items(
    recommendations: Recommendations,
    index: Any,
    new_items: Iterable[Hashable],
    *,
    share: float,
    match_levels: int | None = None,
    k: int | None = None,
) -> Recommendations:
    """Top-``k`` lists in which up to ``floor(share * k)`` slots go to new items near the model's picks.

    Walking each list best first, every item keeps its place and is followed by the new items whose SID
    starts with the same ``match_levels`` codes (nearest first: by the distance of their quantised
    vectors, the sums of their codebook vectors), each with the score of the item it matched, until the
    new-item quota is spent; new items the model ranked itself count towards the quota (beyond it they
    are dropped). ``share=0`` keeps the model's new items out entirely.

    Args:
        recommendations: the model's lists (e.g. from :func:`~peft_grounded.decoding.recommend` with ``num_beams``
            above ``k``, so that there are more generated items to match and to fill with).
        index: the (grown) :class:`~peft_grounded.sids.SIDIndex` holding old and new items.
        new_items: the items added since the model was trained (``child.added_items()``).
        share: the most new items a list may hold, as a fraction of ``k`` (0 to 1).
        match_levels: leading codes a new item must share with a generated item (default: all levels
            but the last).
        k: list length (default ``recommendations.k``).

    Returns:
        New :class:`Recommendations`; ``extra["new_items_per_list"]`` counts the new items in each list.
    """
    k = recommendations.k if k is None else k
    levels = default_match_levels(index) if match_levels is None else match_levels
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"share must be a fraction of k between 0 and 1, got {share}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not 1 <= levels <= index.n_levels - 1:
        raise ValueError(
            f"match_levels={levels} must be between 1 and {index.n_levels - 1} (the index has {index.n_levels} "
            "levels; matching all of them would only match the same SID)"
        )
    new = {str(item) for item in new_items}
    missing = sorted(item for item in new if item not in index)
    if missing:
        raise ValueError(
            f"{len(missing)} new items are not in the SID index (e.g. {missing[:3]}): pass the grown index "
            "(SIDIndex.add_items) that holds them"
        )
    quota = int(share * k + 1e-9)
    regions: dict[tuple[int, ...], list[str]] = {}  # prefix -> the new items under it
    # generated item -> its region's new items, nearest first (computed once per call)
    mates: dict[str, list[str]] = {}
    items_out: list[list[Hashable]] = []
    scores_out: list[list[float]] = []
    counts: list[int] = []
    for items, scores in zip(recommendations.items, recommendations.scores, strict=True):
        chosen: list[Hashable] = []
        chosen_scores: list[float] = []
        taken: set[str] = set()
        n_new = 0
        for item, score in zip(items, scores, strict=True):
            if len(chosen) == k:
                break
            key = str(item)
            if key in taken:
                continue
            if key in new:
                if n_new == quota:
                    continue
                n_new += 1
            chosen.append(item)
            chosen_scores.append(score)
            taken.add(key)
            if key not in mates:
                prefix = index.sid_of(key)[:levels]
                if prefix not in regions:
                    regions[prefix] = [i for i in index.items_with_prefix(prefix) if i in new]
                mates[key] = nearest_first(index, key, regions[prefix])
            for mate in mates[key]:
                if len(chosen) == k or n_new == quota:
                    break
                if mate not in taken:
                    chosen.append(mate)
                    chosen_scores.append(score)
                    taken.add(mate)
                    n_new += 1
        items_out.append(chosen)
        scores_out.append(chosen_scores)
        counts.append(n_new)
    extra = dict(recommendations.extra) | {"new_items_per_list": counts}
    return replace(recommendations, items=items_out, scores=scores_out, k=k, extra=extra)


def random_slots(
    recommendations: Recommendations, new_items: list[str], share: float, k: int, seed: int
) -> list[list[str]]:
    """The control for any new-item rule: the model's first ``k - floor(share * k)`` items, then random new
    items (seeded, history-blind) in the remaining slots."""
    rng = random.Random(seed)
    quota = int(share * k + 1e-9)
    new = set(new_items)
    lists = []
    for items in recommendations.items:
        kept = [i for i in items if i not in new][: k - quota]
        fill = [i for i in rng.sample(new_items, min(len(new_items), quota + k)) if i not in kept]
        lists.append(kept + fill[: k - len(kept)])
    return lists
