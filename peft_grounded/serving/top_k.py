"""The one route from a model to users' top-``k`` lists: :func:`top_k_lists`.

``evaluate`` (:func:`peft_grounded.evaluation.evaluate`), :meth:`GroundedRecommender.recommend` (and so
``peft-grounded recommend``) and the benchmark protocols all call it, so what is measured is what is served:

1. each history becomes the prompt the adapter was trained on (its prompt format, the last ``max_history``
   items; :func:`~peft_grounded.decoding.search.history_prompts`);
2. the SID-constrained beam search (:func:`peft_grounded.decoding.recommend`, the package's one engine;
   :func:`~peft_grounded.decoding.search.model_beams` runs steps 1 and 2) gives the model's
   ``max(num_beams, k)`` best items, the user's own items left out inside the search when
   ``exclude_history`` (no beam is spent on them);
3. with a new-item rule (:class:`~peft_grounded.new_items.NewItemRule`, the one stored with the adapter),
   the rule mixes the new items into those beams (or into text KNN beams, when it chose text on the log;
   with a model weight, also the model's search over the new items,
   :func:`~peft_grounded.new_items.new_item_beams`); its lists leave the history out whatever
   ``exclude_history`` says, and a user whose list came up short is searched again with beams for the
   history items it left out;
4. with a peer fusion instead (:class:`~.peer_fusion.PeerFusion`, the one stored with the adapter), the
   beams are fused with the peer's next-item distribution; its lists leave the history out too;
5. each list is cut to ``k``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..decoding.search import Recommendations, model_beams, sid_trie
from ..new_items.beams import new_item_beams

if TYPE_CHECKING:
    from ..decoding import SIDTrie
    from ..decoding.heads import SIDSoftmax


def top_k_lists(
    model: Any,
    tokenizer: Any,
    index: Any,
    histories: Sequence[Sequence[str]],
    k: int,
    *,
    fmt: Any = None,
    catalogue: Any = None,
    new_item_rule: Any = None,
    peer_fusion: Any = None,
    num_beams: int = 20,
    exclude_history: bool = True,
    trie: SIDTrie | None = None,
    sid_softmax: SIDSoftmax = None,
    batch_size: int = 32,
    targets: Sequence[Sequence[int]] | None = None,
    beams: Recommendations | None = None,
    show_progress: bool = False,
) -> Recommendations:
    """Each history's ``k`` best items (fewer only when the trie holds fewer that are not left out), best
    first, with their scores: the lists ``recommend`` serves and ``evaluate`` measures.

    Args:
        model, tokenizer: the model (its adapter loaded, or merged with ``sid_softmax`` given) and its
            tokenizer with the SID tokens.
        index: the SID index the model was trained (or grown) on.
        histories: each user's items, oldest first (the whole history: the prompt shows the last
            ``fmt.max_history``, and the whole of it is left out of the list).
        k: items per list.
        fmt, catalogue: the adapter's prompt format and, when its prompts carry titles, the catalogue.
        new_item_rule: the new-item rule stored with the adapter (None: the model alone).
        peer_fusion: the peer fusion stored with the adapter (None: the model alone); not with a rule.
        num_beams: beams of the search (at least ``k``, at most the trie's items).
        exclude_history: leave each user's own items out of their list (the rule always does).
        trie: the items that may be listed (default every item of ``index``).
        sid_softmax: how each step normalises (:data:`~peft_grounded.decoding.heads.SIDSoftmax`).
        batch_size: prompts per decoding batch.
        targets: one SID (token ids) per history, scored from the same prompt cache into
            ``extra["target_nlls"]`` (the model alone only).
        beams: the model's beams for these histories, already decoded by
            :func:`~peft_grounded.decoding.search.model_beams` at this width without exclusion (a
            benchmark's cache): used in place of the first search where it is that search (no history left
            out inside it).

    Returns:
        :class:`~peft_grounded.decoding.Recommendations` of ``k`` items per history; the decoding counters
        are those of the first search; with a rule, ``extra["new_items_per_list"]`` counts the new items of
        each list and ``extra["new_item_prior"]`` holds each user's ``pi_u``.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    trie = sid_trie(tokenizer, index) if trie is None else trie
    histories = [list(h) for h in histories]
    width = min(len(trie), max(num_beams, k))
    search = dict(fmt=fmt, catalogue=catalogue, trie=trie, sid_softmax=sid_softmax, batch_size=batch_size)
    if beams is not None and (beams.num_beams != width or len(beams.items) != len(histories)):
        raise ValueError(
            f"beams were decoded for {len(beams.items)} histories at width {beams.num_beams}; this route "
            f"searches {len(histories)} at width {width}"
        )
    if peer_fusion is not None:
        if new_item_rule is not None:
            raise ValueError(
                "this adapter holds a new-item rule and a peer fusion, and they are not served together (the "
                "peer knows no item added after it was fitted): delete one of them from the adapter's folder"
            )
        if targets is not None:
            raise ValueError("targets are scored by the model alone: pass peer_fusion=None to score them")
    if new_item_rule is None:
        inside = exclude_history or peer_fusion is not None  # the search itself leaves the history out
        found = beams
        if found is None or inside:
            found = model_beams(
                model,
                tokenizer,
                index,
                histories,
                width,
                exclude=histories if inside else None,
                targets=targets,
                show_progress=show_progress,
                **search,
            )
        if peer_fusion is not None:
            return peer_fusion.apply(found, histories, k, trie)
        return replace(
            found, items=[row[:k] for row in found.items], scores=[row[:k] for row in found.scores], k=k
        )
    if targets is not None:
        raise ValueError("targets are scored by the model alone: pass new_item_rule=None to score them")

    def mixed(users: list[list[str]], wide: int, cached: Recommendations | None, progress: bool) -> Any:
        news = None
        if new_item_rule.beams == "text":  # the rule chose text KNN on the log: no model run
            recs = new_item_rule.mixture.text_beams(users, wide, trie)
        else:
            recs = cached
            if recs is None:
                recs = model_beams(model, tokenizer, index, users, wide, show_progress=progress, **search)
            if new_item_rule.model_weight:
                rest = {key: value for key, value in search.items() if key != "trie"}
                news = new_item_beams(
                    model, tokenizer, index, users, new_item_rule.new_items, wide, trie=trie, **rest
                )
        return recs, new_item_rule.apply(recs, users, k, news)

    first, served = mixed(histories, width, beams, show_progress)
    items, scores = _kept(served, histories, trie, k)
    for u in [u for u, row in enumerate(items) if len(row) < k]:
        wide = min(len(trie), width + len({i for i in histories[u] if i in trie}))
        if wide > width:
            _, again = mixed([histories[u]], wide, None, False)
            (items[u],), (scores[u],) = _kept(again, [histories[u]], trie, k)
    new = set(new_item_rule.new_items)
    extra = dict(first.extra) | {
        "new_items_per_list": [sum(str(i) in new for i in row) for row in items],
        "new_item_prior": list(served.extra["new_item_prior"]),
    }
    counters = {name: getattr(first, name) for name in COUNTERS}
    return Recommendations(items=items, scores=scores, k=k, num_beams=width, extra=extra, **counters)


COUNTERS = ("num_beams_returned", "num_invalid", "num_duplicate", "num_filler")


def _kept(
    recs: Recommendations, histories: list[list[str]], trie: SIDTrie, k: int
) -> tuple[list[list[Any]], list[list[float]]]:
    """Each list's first ``k`` items (and scores) that its history does not hold and the trie does."""
    items, scores = [], []
    for history, row, values in zip(histories, recs.items, recs.scores, strict=True):
        seen = set(history)
        pairs = [(i, s) for i, s in zip(row, values, strict=True) if i not in seen and i in trie][:k]
        items.append([i for i, _ in pairs])
        scores.append([s for _, s in pairs])
    return items, scores
