"""Recommend with a trained grounded adapter: :class:`GroundedRecommender`.

``GroundedRecommender.from_pretrained(folder_or_hub_id)`` loads what a trained recommender is made of (the
base model and its tokenizer, the grounded adapter, the SID index, the prompt format the adapter records and,
when one is stored, the new-item rule) with the checks of :func:`peft_grounded.hub.load_grounded`;
:meth:`GroundedRecommender.recommend` turns users' histories into their top-``k`` items by the package's
SID-constrained beam search (:func:`peft_grounded.decoding.recommend`, the fast engine for fixed-length SIDs).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .histories import check_histories
from .new_item_rule import RULE_FILES, NewItemRule

SERVING_RECORD = "grounded_serving.json"  # what a merged model folder records besides the model
DEFAULT_BEAMS = 20


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
        num_beams: int = DEFAULT_BEAMS,
        batch_size: int = 32,
    ) -> None:
        from ..decoding import SIDTrie
        from ..evaluation.users import item_token_ids
        from ..prompts import PromptFormat

        if num_beams < 1 or batch_size < 1:
            raise ValueError(f"num_beams and batch_size must be >= 1, got {num_beams} and {batch_size}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.index = index
        self.fmt = fmt or PromptFormat()
        self.catalogue = _catalogue(catalogue)
        self.num_beams = num_beams
        self.batch_size = batch_size
        self.sids = item_token_ids(tokenizer, index)
        self.trie = SIDTrie(self.sids)
        self.new_item_rule: NewItemRule | None = None
        if new_item_rule is not None:
            self.set_new_item_rule(new_item_rule)

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
    ) -> GroundedRecommender:
        """Load a recommender from a folder or a Hub repo: a grounded adapter (with its ``sid_index/`` or
        ``sid_index=``), or a merged model folder written by :meth:`save_merged`.

        Args:
            path_or_hub_id: local folder (read offline) or Hub repo id (only safe files are downloaded).
            sid_index: SID index folder (or a loaded index) when the adapter does not carry one.
            model_name_or_path: base model; default the one the adapter records (a local folder, or the
                packaged SmolLM2-135M when it was made on SmolLM2).
            catalogue: a catalogue (path, ``"movielens-100k"`` or a loaded one) for the items' titles.
            device: ``"cpu"``, ``"cuda"``, ...; default CUDA when available. dtype: ``"auto"`` (bf16 on a GPU
                that supports it, see :mod:`peft_grounded.precision`; float32 on a CPU, where bf16 served no
                faster and changed the lists), ``"float32"`` or ``"bfloat16"``.
            merge: fold the adapter into the base weights (the same outputs up to rounding, a faster forward).
            num_beams, batch_size: the beam width (at least ``k``) and users per decoding batch.
        """
        import torch

        from ..hub.repo import ADAPTER_CONFIG, SAFE_PATTERNS, GroundedHubError, check_adapter_files

        source = _open_source(path_or_hub_id, revision, token)
        if ADAPTER_CONFIG not in source.files and "config.json" not in source.files:
            raise GroundedHubError(
                f"The {source.where} holds neither a grounded adapter ({ADAPTER_CONFIG}) nor a merged model "
                "(config.json): give the adapter's folder (e.g. OUTPUT_DIR/adapter of `sft`) or its Hub repo id"
            )
        if ADAPTER_CONFIG in source.files:  # a repo with pickled weights only: refused before any download
            check_adapter_files(list(source.files), source.where)
        folder = source.folder or _fetch(source, SAFE_PATTERNS)
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        torch_dtype = _dtype(dtype, device)
        if ADAPTER_CONFIG in source.files:
            model, tokenizer, index, fmt = _load_adapter(
                folder, source.where, sid_index, model_name_or_path, torch_dtype, merge
            )
        else:
            model, tokenizer, index, fmt = _load_merged(folder, source.where, sid_index, torch_dtype)
        rule = NewItemRule.load(folder)
        if rule is not None:
            rule.check_index(index, source.where)
        recommender = cls(
            model.to(device),
            tokenizer,
            index,
            fmt,
            catalogue=_catalogue(catalogue),
            new_item_rule=rule,
            num_beams=num_beams,
            batch_size=batch_size,
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
        self.new_item_rule = rule

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
        interactions = [list(h) for h in interactions]
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
        histories (a seeded sample of the ``(history, next item)`` pairs); returns the choice."""
        import random

        from .new_item_rule import calibration_pairs

        rule.check_index(self.index, "the given rule")
        pairs = calibration_pairs(interactions, self.index)
        pairs = random.Random(seed).sample(pairs, min(choice_users, len(pairs)))
        histories = [list(h) for h, _ in pairs]
        beams = min(len(self.trie), max(self.num_beams, k))
        found = self._model_beams(histories, self.trie, beams, show_progress=False)
        return rule.choose_beams(found, histories, [t for _, t in pairs], k, seed=seed)

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
        """
        from ..decoding import SIDTrie

        names = [str(u) for u in users] if users is not None else [f"#{u}" for u in range(len(histories))]
        if len(names) != len(histories):
            raise ValueError(f"{len(names)} user names for {len(histories)} histories")
        checked = check_histories(histories, self.index, skip_unknown=skip_unknown, users=names)
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        groups = self._candidate_groups(candidates, len(histories))
        results: list[UserRecommendations | None] = [None] * len(histories)
        for allowed, members in groups:
            trie = self.trie if allowed is None else SIDTrie({i: self.sids[i] for i in allowed})
            if k > len(trie):
                what = "catalogue" if allowed is None else "candidate set"
                raise ValueError(f"k={k} exceeds the {what}'s {len(trie)} items; lower k")
            lists = self._decode(
                [checked.histories[u] for u in members], trie, k, exclude_history, show_progress
            )
            for u, (items, scores) in zip(members, lists, strict=True):
                results[u] = self._result(names[u], items, scores, checked.unknown[u])
        return results  # type: ignore[return-value]

    def _candidate_groups(self, candidates: Any, n: int) -> list[tuple[tuple[str, ...] | None, list[int]]]:
        if candidates is None:
            return [(None, list(range(n)))]
        candidates = list(candidates)
        per_user = bool(candidates) and not isinstance(candidates[0], (str, bytes, int))
        sets = [tuple(dict.fromkeys(str(i) for i in c)) for c in candidates] if per_user else None
        if per_user and len(sets) != n:
            raise ValueError(
                f"{len(sets)} candidate sets for {n} histories: give one per user, or one for all"
            )
        sets = sets or [tuple(dict.fromkeys(str(i) for i in candidates))] * n
        groups: dict[tuple[str, ...], list[int]] = {}
        for u, allowed in enumerate(sets):
            unknown = [i for i in allowed if i not in self.index]
            if unknown:
                raise ValueError(f"candidates {unknown[:5]} are not in the SID index; pass catalogue items")
            if not allowed:
                raise ValueError("an empty candidate set: nothing to recommend from")
            groups.setdefault(allowed, []).append(u)
        return list(groups.items())

    def _decode(
        self, histories: list[list[str]], trie: Any, k: int, exclude_history: bool, show_progress: bool
    ) -> list[tuple[list[Hashable], list[float]]]:
        """Lists of ``k`` (items, scores) per history: beams wide enough for the history items left out (a
        user whose list comes up short is decoded again with ``k`` + their history's width)."""
        rule = self.new_item_rule
        excluding = exclude_history or rule is not None
        beams = min(len(trie), max(self.num_beams, k))
        lists = self._search(histories, trie, beams, k, excluding, show_progress)
        short = [u for u, (items, _) in enumerate(lists) if len(items) < k]
        for u in short:
            wide = min(len(trie), beams + len({i for i in histories[u] if i in trie}))
            if wide > beams:
                lists[u] = self._search([histories[u]], trie, wide, k, excluding, False)[0]
        return lists

    def _search(
        self, histories: list[list[str]], trie: Any, beams: int, k: int, excluding: bool, show_progress: bool
    ) -> list[tuple[list[Hashable], list[float]]]:
        rule = self.new_item_rule
        if rule is not None and rule.beams == "text":  # the rule chose text KNN on the log: no model run
            recs = rule.mixture.text_beams(histories, beams, trie)
        else:
            recs = self._model_beams(histories, trie, beams, show_progress)
        if rule is not None:
            recs = rule.apply(recs, histories, k)
        out = []
        for history, items, scores in zip(histories, recs.items, recs.scores, strict=True):
            seen = set(history) if excluding else set()
            pairs = [(i, s) for i, s in zip(items, scores, strict=True) if i not in seen and i in trie]
            out.append(([i for i, _ in pairs[:k]], [s for _, s in pairs[:k]]))
        return out

    def _model_beams(self, histories: list[list[str]], trie: Any, beams: int, show_progress: bool) -> Any:
        """The model's ``beams`` best items per history (:class:`~peft_grounded.decoding.Recommendations`)."""
        from ..decoding import recommend
        from ..prompts import inference_prompts

        examples = [(str(u), h, None) for u, h in enumerate(histories)]
        _, prompts, _ = inference_prompts(examples, self.index, self.tokenizer, self.catalogue, self.fmt)
        return recommend(
            self.model,
            self.tokenizer,
            prompts,
            trie,
            k=beams,
            num_beams=beams,
            batch_size=self.batch_size,
            show_progress=show_progress,
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
        safetensors), its tokenizer, ``sid_index/``, the prompt format and the new-item rule; atomically."""
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
            record = {"prompt_format": asdict(self.fmt), "sid_index_fingerprint": self.index.fingerprint()}
            (tmp / SERVING_RECORD).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
            if self.new_item_rule is not None:
                self.new_item_rule.save(tmp)
            swap_dir_into_place(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return target


# ---------------------------------------------------------------------- loading helpers


def _open_source(path_or_hub_id: str | Path, revision: str | None, token: str | bool | None) -> Any:
    """The folder or Hub repo; a Hub that cannot be reached is a :class:`GroundedHubError` saying so."""
    from ..hub.repo import GroundedHubError, open_source

    try:
        return open_source(path_or_hub_id, revision=revision, token=token)
    except GroundedHubError:
        raise
    except Exception as err:
        raise _network_error(err, path_or_hub_id) from err


def _fetch(source: Any, patterns: Sequence[str]) -> Path:
    try:
        return source.fetch(patterns)
    except Exception as err:
        raise _network_error(err, source.repo_id) from err


def _network_error(err: BaseException, repo: Any) -> Exception:
    from .._errors import describe
    from ..hub.repo import GroundedHubError

    message = describe(err)
    if message is None or isinstance(err, ValueError):
        return err if isinstance(err, Exception) else RuntimeError(str(err))
    return GroundedHubError(
        f"cannot load {str(repo)!r}: {message}. Nothing was written; a local folder of the adapter loads offline"
    )


def _dtype(dtype: str, device: str) -> Any:
    import torch

    if dtype == "auto":  # bf16 on a GPU that has it; float32 on a CPU, where serving in bf16 was slower even
        # with native bf16 and changed the lists (BENCHMARKS.md, "Serving: recommend against generate")
        from ..precision import choose_precision

        return (
            torch.bfloat16 if device.startswith("cuda") and choose_precision(device).bf16 else torch.float32
        )
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"dtype={dtype!r}: choose auto, float32, bfloat16 or float16")
    return getattr(torch, dtype)


def _catalogue(catalogue: Any) -> Any:
    if catalogue is None or hasattr(catalogue, "items"):
        return catalogue
    from ..sids import load_catalogue

    return load_catalogue(str(catalogue))


def _index(sid_index: Any, folder: Path, where: str) -> Any:
    from ..hub.load import load_sid_index
    from ..hub.repo import SID_INDEX_DIR, GroundedHubError
    from ..sids import SIDIndex

    if sid_index is not None:
        return sid_index if isinstance(sid_index, SIDIndex) else SIDIndex.load(sid_index)
    if (folder / SID_INDEX_DIR).is_dir():
        return load_sid_index(folder)
    raise GroundedHubError(
        f"The {where} holds no SID index ({SID_INDEX_DIR}/): pass the index the adapter was trained or grown "
        "with (sid_index=..., --sid_index DIR)"
    )


def _base_path(config: Any, folder: Path) -> str:
    from ..adapter.loading import base_model_path

    try:
        return base_model_path(str(folder))
    except FileNotFoundError:
        return config.base_model_name_or_path  # a Hub id: transformers fetches it (safetensors only)


def _load_adapter(
    folder: Path, where: str, sid_index: Any, model_path: str | None, dtype: Any, merge: bool
) -> tuple[Any, Any, Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..adapter.loading import check_model_dir, prompt_format_of
    from ..hub.load import load_grounded
    from ..hub.repo import read_adapter_config

    config = read_adapter_config(folder, where)
    index = _index(sid_index, folder, where)
    index.check_adapter(config, where=f"the adapter in the {where}")
    base = model_path or _base_path(config, folder)
    if Path(str(base)).expanduser().exists():
        base = check_model_dir(base, "model_name_or_path")
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype, use_safetensors=True)
    model = load_grounded(model, tokenizer, folder)
    fmt = prompt_format_of(model)
    if merge:
        model = model.merge_and_unload()
    return model, tokenizer, index, fmt


def _load_merged(folder: Path, where: str, sid_index: Any, dtype: Any) -> tuple[Any, Any, Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .._io import read_json
    from ..adapter.loading import check_model_dir
    from ..prompts import PromptFormat

    check_model_dir(folder, "path_or_hub_id")
    index = _index(sid_index, folder, where)
    fmt = PromptFormat()
    if (folder / SERVING_RECORD).is_file():
        record = read_json(folder / SERVING_RECORD)
        fmt = PromptFormat.from_record(record.get("prompt_format", {}), str(folder / SERVING_RECORD))
        recorded = record.get("sid_index_fingerprint")
        if recorded is not None and recorded != index.fingerprint():
            raise ValueError(
                f"the merged model in the {where} was saved with SID index {recorded}, not this one "
                f"({index.fingerprint()}): its SID tokens carry other items' codes; use the index saved with it"
            )
    else:
        warnings.warn(
            f"the {where} has no {SERVING_RECORD}: the default prompt format is used, which may not be the one "
            "the model was trained with (save merged models with GroundedRecommender.save_merged)",
            UserWarning,
            stacklevel=4,
        )
    tokenizer = AutoTokenizer.from_pretrained(folder)
    missing = [t for t in index.token_strings if t not in tokenizer.get_added_vocab()]
    if missing:
        raise ValueError(
            f"the merged model's tokenizer lacks {len(missing)} of the SID index's tokens (e.g. {missing[0]!r}): "
            "this index is not the one the model was merged with"
        )
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, use_safetensors=True)
    return model, tokenizer, index, fmt


__all__ = ["RULE_FILES", "SERVING_RECORD", "GroundedRecommender", "UserRecommendations"]
