"""Recommend with a trained grounded adapter: :class:`GroundedRecommender`.

``GroundedRecommender.from_pretrained(folder_or_hub_id)`` loads what a trained recommender is made of (the
base model and its tokenizer, the grounded adapter, the SID index, the prompt format the adapter records and,
when one is stored, the new-item rule) with the checks of :func:`peft_grounded.hub.load_grounded`;
:meth:`GroundedRecommender.recommend` turns users' histories into their top-``k`` items by the package's one
route (:func:`~.top_k.top_k_lists`: prompts, the SID-constrained beam search, the new-item rule, the history
left out), the one ``evaluate`` measures with.
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..new_items.beams import choose_new_item_beams
from ..new_items.rule import RULE_FILES, NewItemRule
from ..sids import as_catalogue
from ..sids.catalogue_source import catalogue_at_hand
from .loading import (
    SERVING_FORMAT,
    SERVING_RECORD,
    HistoryInputError,
    check_histories,
    check_user_names,
    decoding_rows,
    fetch_safe_files,
    load_adapter_parts,
    load_merged_parts,
    open_recommender_source,
    serving_dtype,
)
from .peer_fusion import PeerFusion, stored_fix
from .top_k import top_k_lists

if TYPE_CHECKING:
    from ..decoding.heads import SIDSoftmax

DEFAULT_BEAMS = 20
logger = logging.getLogger(__name__)


@dataclass
class UserRecommendations:
    """One user's top items, best first, with their scores (log-probabilities: of the item's SID under the
    model, or of the new-item rule's mixture) and titles (``None`` without a catalogue)."""

    user: str
    items: list[str]
    scores: list[float]
    titles: list[str | None]
    new_items: int = 0  # how many of the items the index added after the adapter was trained
    skipped: list[str] = field(default_factory=list)  # history items left out as unknown (skip_unknown)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def table(self) -> str:
        """A readable list: rank, item id, title, score."""
        width = max([len("item"), *(len(i) for i in self.items)])
        lines = [f"{'rank':>4}  {'item':<{width}}  {'score':>9}  title"]
        for rank, (item, score, title) in enumerate(
            zip(self.items, self.scores, self.titles, strict=True), 1
        ):
            lines.append(f"{rank:>4}  {item:<{width}}  {score:>9.4f}  {title or '-'}")
        return "\n".join(lines)


@dataclass
class Request:
    """A checked request: user names, histories (unknown items dropped where allowed, and what was), and
    the users grouped by the trie their candidates give."""

    names: list[str]
    histories: list[list[str]]
    unknown: list[list[str]]
    groups: list[tuple[Any, list[int]]]


class GroundedRecommender:
    """A trained grounded recommender, ready to serve: model, tokenizer, SID index, prompt format."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        index: Any,
        fmt: Any = None,
        *,
        catalogue: Any = None,
        new_item_rule: NewItemRule | None = None,
        peer_fusion: PeerFusion | None = None,
        num_beams: int = DEFAULT_BEAMS,
        batch_size: int = 32,
        sid_softmax: SIDSoftmax = None,
    ) -> None:
        """``sid_softmax``: how each decoding step normalises, as the model was trained (see
        :data:`~peft_grounded.decoding.heads.SIDSoftmax`); ``None`` reads it from the model's grounded
        adapter. A model without one (merged) must say: ``True`` (the SID rows of ``index``, ``sft``'s
        default), ``False`` (the whole vocabulary) or the rows' token ids."""
        from ..decoding import SIDTrie
        from ..decoding.trie import item_token_ids
        from ..prompts import PromptFormat

        for name, value in (("num_beams", num_beams), ("batch_size", batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.index = index
        self.fmt = fmt or PromptFormat()
        self.catalogue = as_catalogue(catalogue)
        if self.fmt.with_titles and self.catalogue is None:
            raise ValueError(
                "this model's prompts carry item titles (its prompt format has with_titles=True), and no "
                "catalogue was given: without the titles the prompts are not the ones it learnt. Pass "
                "catalogue= (--catalogue) with the catalogue it was trained on"
            )
        self.num_beams = num_beams
        self.batch_size = batch_size
        self.sids = item_token_ids(tokenizer, index)
        self.trie = SIDTrie(self.sids)
        self.sid_rows = decoding_rows(model, tokenizer, index, self.trie, sid_softmax)
        self.new_item_rule: NewItemRule | None = None
        self.peer_fusion: PeerFusion | None = None
        if new_item_rule is not None:
            self.set_new_item_rule(new_item_rule)
        if peer_fusion is not None:
            self.set_peer_fusion(peer_fusion)

    # ------------------------------------------------------------------ loading

    @classmethod
    def from_pretrained(
        cls,
        path_or_hub_id: str | Path,
        *,
        sid_index: Any = None,
        model_name_or_path: str | None = None,
        catalogue: Any = None,
        revision: str | None = None,
        token: str | bool | None = None,
        device: str | None = None,
        dtype: str = "auto",
        merge: bool = True,
        num_beams: int = DEFAULT_BEAMS,
        batch_size: int = 32,
        sid_softmax: SIDSoftmax = None,
        peer_fusion: bool = True,
    ) -> GroundedRecommender:
        """Load a recommender from a folder or a Hub repo: a grounded adapter (with its ``sid_index/`` or
        ``sid_index=``), or a merged model folder written by :meth:`save_merged`.

        Args:
            path_or_hub_id: local folder (read offline) or Hub repo id (only safe files are downloaded).
            sid_index: SID index folder (or a loaded index) when the adapter does not carry one.
            model_name_or_path: base model; default the one the adapter records (a local folder, or the
                packaged SmolLM2-135M when it was made on SmolLM2).
            catalogue: a catalogue (path, ``"movielens-100k"`` or a loaded one) for the items' titles, checked
                against the SID index's record; None: the one the index was built from, when it can be found.
            device: ``"cpu"``, ``"cuda"``, ...; default CUDA when available. dtype: ``"auto"`` (bf16 on a GPU
                that supports it, see :mod:`peft_grounded.precision`; float32 on a CPU, the exact lists),
                ``"float32"`` or ``"bfloat16"``.
            merge: fold the adapter into the base weights (the same outputs up to rounding, a faster forward);
                decoding keeps the normalisation the adapter was trained with either way.
            num_beams, batch_size: the beam width (at least ``k``) and users per decoding batch.
            sid_softmax: ``None`` (default): decode as the adapter (or the merged folder's
                ``grounded_serving.json``) records it was trained; ``True``/``False`` override that.
            peer_fusion: serve the peer fusion stored in the folder (``fuse-peer``), when there is one;
                ``False``: the model's lists alone.
        """
        import torch

        from ..hub.repo import ADAPTER_CONFIG, SAFE_PATTERNS, GroundedHubError, check_adapter_files

        source = open_recommender_source(path_or_hub_id, revision, token)
        if ADAPTER_CONFIG not in source.files and "config.json" not in source.files:
            raise GroundedHubError(
                f"The {source.where} holds neither a grounded adapter ({ADAPTER_CONFIG}) nor a merged model "
                "(config.json): give the adapter's folder (e.g. OUTPUT_DIR/adapter of `sft`) or its Hub repo id"
            )
        if ADAPTER_CONFIG in source.files:  # a repo with pickled weights only: refused before any download
            check_adapter_files(list(source.files), source.where)
        folder = source.folder or fetch_safe_files(source, SAFE_PATTERNS)
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        torch_dtype = serving_dtype(dtype, device)
        if ADAPTER_CONFIG in source.files:
            model, tokenizer, index, fmt, rows = load_adapter_parts(
                folder, source.where, sid_index, model_name_or_path, torch_dtype, merge, sid_softmax
            )
        else:
            model, tokenizer, index, fmt, rows = load_merged_parts(
                folder, source.where, sid_index, torch_dtype, sid_softmax
            )
        rule = NewItemRule.load(folder)
        if rule is not None:
            rule.check_index(index, source.where)
        fusion = PeerFusion.load(folder) if peer_fusion else None
        if fusion is not None:
            fusion.check_index(index, source.where, stored_fix(folder) if source.folder else None)
        recommender = cls(
            model.to(device),
            tokenizer,
            index,
            fmt,
            catalogue=catalogue_at_hand(index, catalogue, needed=fmt is not None and fmt.with_titles),
            new_item_rule=rule,
            peer_fusion=fusion,
            num_beams=num_beams,
            batch_size=batch_size,
            sid_softmax=rows,
        )
        recommender._check_new_items(source.where)
        return recommender

    def _check_new_items(self, where: str) -> None:
        added = self.index.added_items()
        if added and self.new_item_rule is None:
            warnings.warn(
                f"the SID index added {len(added)} items after the adapter was trained, and the {where} holds no "
                "new-item rule: they are ranked by the model alone, which rarely reaches them. Fit the rule on "
                "the interactions logged since training (grow-adapter --interactions FILE, recommend "
                "--interactions FILE, or GroundedRecommender.fit_new_items)",
                UserWarning,
                stacklevel=3,
            )

    def set_new_item_rule(self, rule: NewItemRule) -> None:
        """Serve the new items with ``rule`` (checked against this recommender's index)."""
        rule.check_index(self.index, "the given rule")
        self._refuse_rule_with_fusion()
        self.new_item_rule = rule

    def _refuse_rule_with_fusion(self) -> None:
        if self.peer_fusion is not None:
            raise ValueError(
                "this recommender serves a peer fusion (fuse-peer), whose peer knows no item added after it was "
                "fitted: delete peer_fusion.json, sasrec.json and sasrec.safetensors from the adapter's folder "
                "(or call set_peer_fusion(None)) before fitting a new-item rule"
            )

    def set_peer_fusion(self, fusion: PeerFusion | None) -> None:
        """Serve the model's beams fused with ``fusion``'s peer (checked against this recommender's index);
        ``None``: the model alone."""
        if fusion is not None:
            fusion.check_index(self.index, "the given fusion")
            if self.new_item_rule is not None:
                raise ValueError(
                    "this recommender serves a new-item rule, and a peer fusion knows no item added after it "
                    "was fitted: serve one of them"
                )
        self.peer_fusion = fusion

    def fit_new_items(
        self,
        interactions: Iterable[Sequence[str]],
        *,
        choose_beams: bool = True,
        choice_users: int = 500,
        k: int = 10,
        seed: int = 0,
        **kwargs: Any,
    ) -> NewItemRule:
        """Fit the new-item rule on logged ``interactions`` (each user's items, the newest last) and serve
        with it; see :meth:`NewItemRule.fit` for ``kwargs``. Save it with ``rule.save(adapter_folder)``.

        ``choose_beams``: decode this model on up to ``choice_users`` logged histories (a seeded sample) and
        let :meth:`NewItemRule.choose_beams` keep the model's beams or, where text KNN serves the logged next
        items better with a paired interval above 0, switch the rule to text."""
        self._refuse_rule_with_fusion()
        interactions = [list(h) for h in interactions]
        if kwargs.get("vectors") is None:  # the text of this recommender's catalogue, for a behaviour index
            kwargs.setdefault("catalogue", self.catalogue)
        rule = NewItemRule.fit(self.index, interactions, **kwargs)
        if choose_beams:
            self.choose_new_item_beams(rule, interactions, choice_users=choice_users, k=k, seed=seed)
        self.set_new_item_rule(rule)
        return rule

    def choose_new_item_beams(
        self,
        rule: NewItemRule,
        interactions: Iterable[Sequence[str]],
        *,
        choice_users: int = 500,
        k: int = 10,
        seed: int = 0,
    ) -> dict[str, Any]:
        """:meth:`NewItemRule.choose_beams` with this model's beams on up to ``choice_users`` logged
        histories (a seeded sample of the ``(history, next item)`` pairs), then
        :meth:`NewItemRule.choose_model_weight` with its search over the new items; returns the choices
        (:func:`peft_grounded.new_items.choose_new_item_beams` with this recommender's decoding)."""
        return choose_new_item_beams(
            self.model,
            self.tokenizer,
            self.index,
            rule,
            interactions,
            num_beams=self.num_beams,
            choice_users=choice_users,
            k=k,
            seed=seed,
            **self._search(),
        )

    # ------------------------------------------------------------------ serving

    def recommend(
        self,
        histories: Sequence[Sequence[str]],
        k: int = 10,
        exclude_history: bool = True,
        candidates: Iterable[str] | Sequence[Iterable[str]] | None = None,
        *,
        users: Sequence[str] | None = None,
        skip_unknown: bool = False,
        show_progress: bool = False,
    ) -> list[UserRecommendations]:
        """The top-``k`` items of each history (item ids, oldest first), best first.

        Args:
            exclude_history: leave the items a user already has out of their list (the new-item rule always
                does).
            candidates: restrict every list to these items (one collection), or each user's to their own
                (one collection per user).
            users: names for the results and messages (default ``#0``, ``#1``, ...).
            skip_unknown: drop history items the SID index does not hold (counted in ``skipped``) instead of
                refusing them.

        Every input is checked (:meth:`check_request`) before anything is decoded.
        """
        request = self.check_request(histories, k, candidates, users=users, skip_unknown=skip_unknown)
        results: list[UserRecommendations | None] = [None] * len(request.names)
        for trie, members in request.groups:
            lists = self._decode(
                [request.histories[u] for u in members], trie, k, exclude_history, show_progress
            )
            for u, (items, scores) in zip(members, lists, strict=True):
                results[u] = self._result(request.names[u], items, scores, request.unknown[u])
        return results  # type: ignore[return-value]

    def check_request(
        self,
        histories: Sequence[Sequence[str]],
        k: int = 10,
        candidates: Iterable[str] | Sequence[Iterable[str]] | None = None,
        *,
        users: Sequence[str] | None = None,
        skip_unknown: bool = False,
    ) -> Request:
        """Check a request as :meth:`recommend` takes it, decoding nothing: users, histories, ``k`` and
        candidates; a bad value is a ``ValueError`` (:class:`HistoryInputError` for histories) naming it."""
        from ..decoding import SIDTrie

        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be an integer >= 1, got {k!r}")
        if isinstance(histories, (str, bytes)) or not isinstance(histories, Sequence):
            raise HistoryInputError(
                "histories is a list of histories (one list of item ids per user); for one user pass [history]"
            )
        names = check_user_names(users, len(histories))
        checked = check_histories(histories, self.index, skip_unknown=skip_unknown, users=names)
        groups = []
        for allowed, members in self._candidate_groups(candidates, len(names)):
            trie = self.trie if allowed is None else SIDTrie({i: self.sids[i] for i in allowed})
            if k > len(trie):
                what = "catalogue" if allowed is None else "candidate set"
                raise ValueError(f"k={k} exceeds the {what}'s {len(trie)} items; lower k")
            groups.append((trie, members))
        return Request(names, checked.histories, checked.unknown, groups)

    def _candidate_groups(self, candidates: Any, n: int) -> list[tuple[tuple[str, ...] | None, list[int]]]:
        if candidates is None:
            return [(None, list(range(n)))]
        if isinstance(candidates, (str, bytes)):
            raise ValueError(
                f"candidates={candidates!r} is one string, not a collection of item ids: pass a list "
                f"([{candidates!r}] for that one item), or one list per user"
            )
        candidates = list(candidates)
        per_user = bool(candidates) and not isinstance(candidates[0], (str, bytes, int))
        if per_user:
            for u, group in enumerate(candidates):
                if isinstance(group, (str, bytes)) or not isinstance(group, Iterable):
                    raise ValueError(
                        f"candidates[{u}] is {group!r}: give one list of item ids per user, or one list for all"
                    )
        groups_in = [list(c) for c in candidates] if per_user else [candidates]
        for group in groups_in:
            bad = [i for i in group if isinstance(i, bool) or not isinstance(i, (str, int))]
            if bad:
                raise ValueError(f"candidates hold {bad[:3]}, which are not item ids (strings or integers)")
        sets = [tuple(dict.fromkeys(str(i) for i in c)) for c in groups_in]
        if per_user and len(sets) != n:
            raise ValueError(
                f"{len(sets)} candidate sets for {n} histories: give one per user, or one for all"
            )
        sets = sets if per_user else sets * n
        groups: dict[tuple[str, ...], list[int]] = {}
        for u, allowed in enumerate(sets):
            whose = f"candidates[{u}]" if per_user else "candidates"
            unknown = [i for i in allowed if i not in self.index]
            if unknown:
                raise ValueError(f"{whose}: {unknown[:5]} are not in the SID index; pass catalogue items")
            if not allowed:
                raise ValueError(f"{whose} is empty: nothing to recommend from")
            groups.setdefault(allowed, []).append(u)
        return list(groups.items())

    def _decode(
        self, histories: list[list[str]], trie: Any, k: int, exclude_history: bool, show_progress: bool
    ) -> list[tuple[list[Hashable], list[float]]]:
        """Lists of ``k`` (items, scores) per history, by the package's one route
        (:func:`~.top_k.top_k_lists`, the one ``evaluate`` measures with)."""
        found = top_k_lists(
            self.model,
            self.tokenizer,
            self.index,
            histories,
            k,
            new_item_rule=self.new_item_rule,
            peer_fusion=self.peer_fusion,
            num_beams=self.num_beams,
            exclude_history=exclude_history,
            show_progress=show_progress,
            **self._search(trie),
        )
        return list(zip(found.items, found.scores, strict=True))

    def _search(self, trie: Any = None) -> dict[str, Any]:
        """How this recommender decodes: its prompt format, catalogue, trie, rows and batch size."""
        return dict(
            fmt=self.fmt,
            catalogue=self.catalogue,
            trie=self.trie if trie is None else trie,
            sid_softmax=self.sid_rows,
            batch_size=self.batch_size,
        )

    def _result(
        self, user: str, items: list[Hashable], scores: list[float], skipped: list[str]
    ) -> UserRecommendations:
        items = [str(i) for i in items]
        new = (
            set(self.new_item_rule.new_items)
            if self.new_item_rule is not None
            else set(self.index.added_items())
        )
        return UserRecommendations(
            user=user,
            items=items,
            scores=[float(s) for s in scores],
            titles=[self.title(i) for i in items],
            new_items=sum(i in new for i in items),
            skipped=list(skipped),
        )

    def title(self, item: str) -> str | None:
        """The item's title from the catalogue, if one was given and holds it."""
        if self.catalogue is None or item not in self.catalogue.items:
            return None
        return self.catalogue.items[item].title or None

    # ------------------------------------------------------------------ saving

    def save_merged(self, folder: str | Path) -> Path:
        """Write a merged model folder that :meth:`from_pretrained` loads: the model (adapter folded in,
        safetensors), its tokenizer, ``sid_index/``, the new-item rule or peer fusion, and ``grounded_serving.json``: the
        prompt format and the rows each decoding step normalises over; atomically."""
        import shutil

        from .._io import make_temp_dir, swap_dir_into_place

        target = Path(folder)
        if target.exists() and (not target.is_dir() or any(target.iterdir())):
            raise ValueError(f"{target} exists and is not an empty folder; choose a new one")
        model = self.model.merge_and_unload() if hasattr(self.model, "merge_and_unload") else self.model
        tmp = make_temp_dir(target)
        try:
            model.save_pretrained(tmp, safe_serialization=True)
            self.tokenizer.save_pretrained(tmp)
            self.index.save(tmp / "sid_index")
            record = {
                "format": SERVING_FORMAT,
                "prompt_format": asdict(self.fmt),
                "sid_index_fingerprint": self.index.fingerprint(),
                "sid_token_ids": None if self.sid_rows is False else self.sid_rows.tolist(),
            }
            (tmp / SERVING_RECORD).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
            if self.new_item_rule is not None:
                self.new_item_rule.save(tmp)
            if self.peer_fusion is not None:
                self.peer_fusion.save(tmp)
            swap_dir_into_place(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return target


__all__ = ["RULE_FILES", "SERVING_RECORD", "GroundedRecommender", "Request", "UserRecommendations"]
