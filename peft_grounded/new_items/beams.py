"""The model's searches a new-item rule reads: :func:`new_item_beams`, the model's best *new* items per history
(the model's expert of a rule with a ``model_weight``), and :func:`choose_new_item_beams`, the rule's choices
on logged histories (whose beams it mixes, and its model weight), made with this model's searches.

Both run the search serving runs (:func:`peft_grounded.decoding.search.model_beams`);
:func:`peft_grounded.serving.top_k_lists` serves the rule with them, and
``GroundedRecommender.choose_new_item_beams`` (so ``fit_new_items`` and ``grow-adapter --interactions``) makes
its choices with this recommender's settings.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ..decoding.search import Recommendations, model_beams, sid_trie
from ..decoding.trie import SIDTrie, item_token_ids
from .rule import calibration_pairs

if TYPE_CHECKING:
    from .rule import NewItemRule


def new_item_beams(
    model: Any,
    tokenizer: Any,
    index: Any,
    histories: Sequence[Sequence[str]],
    new_items: Sequence[str],
    beams: int,
    *,
    trie: SIDTrie | None = None,
    **search: Any,
) -> Recommendations:
    """The model's ``beams`` best *new* items per history (a search over the trie of ``new_items`` within
    ``trie``, each history left out): the model's expert of a new-item rule with a ``model_weight``."""
    ids = item_token_ids(tokenizer, index)
    allowed = [i for i in new_items if i in ids and (trie is None or i in trie)]
    if not allowed:  # a candidate restriction without new items: nothing for the model to weigh
        return Recommendations(
            items=[[] for _ in histories], scores=[[] for _ in histories], k=beams, num_beams=0
        )
    new_trie = SIDTrie({i: ids[i] for i in allowed})
    width = max(1, min(beams, len(allowed)))
    return model_beams(model, tokenizer, index, histories, width, trie=new_trie, exclude=histories, **search)


def choose_new_item_beams(
    model: Any,
    tokenizer: Any,
    index: Any,
    rule: NewItemRule,
    interactions: Iterable[Sequence[str]],
    *,
    num_beams: int = 20,
    choice_users: int = 500,
    k: int = 10,
    seed: int = 0,
    trie: SIDTrie | None = None,
    **search: Any,
) -> dict[str, Any]:
    """:meth:`NewItemRule.choose_beams` with the model's beams on up to ``choice_users`` logged histories (a
    seeded sample of the ``(history, next item)`` pairs), then :meth:`NewItemRule.choose_model_weight` with its
    search over the new items; returns the choices. ``num_beams``: the search's width (at least ``k``, at most
    the trie's items); ``trie`` (default every item of ``index``) and ``search`` (``fmt``, ``catalogue``,
    ``sid_softmax``, ``batch_size``): how the model decodes, as :func:`~peft_grounded.decoding.search.model_beams`
    takes them."""
    rule.check_index(index, "the given rule")
    trie = sid_trie(tokenizer, index) if trie is None else trie
    pairs = calibration_pairs(interactions, index)
    pairs = random.Random(seed).sample(pairs, min(choice_users, len(pairs)))
    histories, targets = [list(h) for h, _ in pairs], [t for _, t in pairs]
    beams = min(len(trie), max(num_beams, k))
    found = model_beams(model, tokenizer, index, histories, beams, trie=trie, **search)
    choice = rule.choose_beams(found, histories, targets, k, seed=seed)
    if rule.beams == "text":  # text KNN's beams: no model search to weigh
        return choice | rule.choose_model_weight(found, histories, targets)
    news = new_item_beams(model, tokenizer, index, histories, rule.new_items, beams, trie=trie, **search)
    return choice | rule.choose_model_weight(news, histories, targets)
