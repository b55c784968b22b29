"""SASRec (Kang & McAuley 2018) trained with full-softmax cross-entropy (Klenitskiy & Vasilev 2023, "SASRec+").

* Model: item embedding (row 0 is padding) scaled by ``sqrt(hidden_size)`` plus a learned position
  embedding (positions count from the right, so the newest item always has the last one), dropout,
  pre-LayerNorm causal Transformer blocks, a final LayerNorm; an item's score is the hidden state's dot
  product with the item's (shared) embedding.
* Training: every user's training history (:class:`~peft_grounded.sids.LeaveOneOut`'s ``history``; the
  validation and test items are never trained on) is cut, from its end, into windows of ``max_length + 1``
  items, so that every history position after the first is a target exactly once per epoch; the loss is
  the cross-entropy over the whole catalogue at every target position. Adam, seeded shuffling and init.
* After every epoch: validation Recall@10 / NDCG@10 (history -> validation item, history items excluded);
  the best epoch's weights are kept; training stops after ``patience`` epochs without a gain, at
  ``max_epochs`` or when ``max_minutes`` have passed. With ``show_progress`` a line on stderr follows the
  epochs: their validation Recall@10 and NDCG@10, the best epoch and the time left (:func:`epoch_progress`).

:func:`fit_sasrec` trains and returns a :class:`SASRecRecommender` (the :class:`~peft_grounded.evaluation.peers.Recommender`
protocol); :meth:`SASRecRecommender.save` / :meth:`SASRecRecommender.load` use safetensors and a JSON file.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import random
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors
from torch import nn

from .._io import atomic_write, atomic_write_text, read_json

FORMAT = "peft_grounded.sasrec"
CONFIG_FILE, WEIGHTS_FILE = "sasrec.json", "sasrec.safetensors"
VALID_METRICS = ("ndcg@10", "recall@10")
SAVE_FIX = "save the recommender again (SASRecRecommender.save), or restore a good copy"
_SCORE_BATCH = 256  # histories scored at once (validation and recommend)


@dataclass
class SASRecConfig:
    """SASRec's architecture, training and stopping settings (defaults work on ML-100K and Amazon Office)."""

    hidden_size: int = field(default=64, metadata={"help": "Width of item embeddings and hidden states."})
    num_blocks: int = field(default=2, metadata={"help": "Transformer blocks."})
    num_heads: int = field(default=1, metadata={"help": "Attention heads per block (divides hidden_size)."})
    dropout: float = field(default=0.5, metadata={"help": "Dropout on embeddings, attention and blocks."})
    max_length: int = field(default=50, metadata={"help": "Items of history the model reads (the newest)."})
    batch_size: int = field(default=128, metadata={"help": "Training windows per step."})
    learning_rate: float = field(default=3e-3, metadata={"help": "Adam's learning rate."})
    weight_decay: float = field(default=0.0, metadata={"help": "Adam's L2 penalty on every weight."})
    max_epochs: int = field(default=200, metadata={"help": "Upper bound on passes over the training data."})
    patience: int = field(
        default=10, metadata={"help": "Epochs without a validation gain before training stops."}
    )
    max_minutes: float | None = field(
        default=None, metadata={"help": "Training time budget in minutes (None: no budget)."}
    )
    valid_metric: str = field(
        default="ndcg@10",
        metadata={"help": "Validation metric that picks the best epoch: ndcg@10 or recall@10."},
    )
    valid_users: int | None = field(
        default=None,
        metadata={"help": "Validation users per epoch: a seeded sample of this many (None: all)."},
    )
    bf16: bool = field(
        default=False,
        metadata={
            "help": "Train under bf16 autocast (scoring stays float32): several times faster on CPUs with "
            "native bf16 (AVX-512 BF16, AMX) and on GPUs, much slower where bf16 is emulated."
        },
    )
    seed: int = field(
        default=0, metadata={"help": "Seed of initialisation, dropout, shuffling and sampling."}
    )
    threads: int | None = field(
        default=None,
        metadata={"help": "torch CPU threads while training and scoring (None: torch's setting)."},
    )

    def __post_init__(self) -> None:
        problems = []
        for name in ("hidden_size", "num_blocks", "num_heads", "max_length", "batch_size", "max_epochs"):
            if not _int_at_least(getattr(self, name), 1):
                problems.append(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if not _int_at_least(self.patience, 1):
            problems.append(f"patience must be an integer >= 1, got {self.patience!r}")
        if (
            _int_at_least(self.hidden_size, 1)
            and _int_at_least(self.num_heads, 1)
            and self.hidden_size % self.num_heads
        ):
            problems.append(f"num_heads ({self.num_heads}) must divide hidden_size ({self.hidden_size})")
        if not (_number(self.dropout) and 0 <= self.dropout < 1):
            problems.append(f"dropout must be in [0, 1), got {self.dropout!r}")
        if not (_number(self.learning_rate) and self.learning_rate > 0):
            problems.append(f"learning_rate must be > 0, got {self.learning_rate!r}")
        if not (_number(self.weight_decay) and self.weight_decay >= 0):
            problems.append(f"weight_decay must be >= 0, got {self.weight_decay!r}")
        if self.max_minutes is not None and not (_number(self.max_minutes) and self.max_minutes > 0):
            problems.append(f"max_minutes must be > 0 or None (no budget), got {self.max_minutes!r}")
        if self.valid_metric not in VALID_METRICS:
            problems.append(f"valid_metric must be one of {VALID_METRICS}, got {self.valid_metric!r}")
        if self.valid_users is not None and not _int_at_least(self.valid_users, 1):
            problems.append(
                f"valid_users must be an integer >= 1 or None (all users), got {self.valid_users!r}"
            )
        if not isinstance(self.bf16, bool):
            problems.append(f"bf16 must be True or False, got {self.bf16!r}")
        if not _int_at_least(self.seed, -(2**63)):
            problems.append(f"seed must be an integer, got {self.seed!r}")
        if self.threads is not None and not _int_at_least(self.threads, 1):
            problems.append(
                f"threads must be an integer >= 1 or None (torch's setting), got {self.threads!r}"
            )
        if problems:
            raise ValueError("SASRecConfig: " + "; ".join(problems))


def _int_at_least(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class SASRecModel(nn.Module):
    """The network: ``forward(inputs)`` maps left-padded item indices ``[B, T]`` (0 = padding, ``T <=
    max_length``) to hidden states ``[B, T, hidden]``; :meth:`scores` gives every item's score."""

    def __init__(self, n_items: int, config: SASRecConfig) -> None:
        super().__init__()
        d = config.hidden_size
        self.max_length = config.max_length
        self.item_embedding = nn.Embedding(n_items + 1, d, padding_idx=0)
        self.position_embedding = nn.Embedding(config.max_length, d)
        self.dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(
                d,
                config.num_heads,
                dim_feedforward=d,
                dropout=config.dropout,
                batch_first=True,
                norm_first=True,
            )
            for _ in range(config.num_blocks)
        )
        self.final_norm = nn.LayerNorm(d)
        self.num_heads = config.num_heads
        nn.init.xavier_normal_(self.item_embedding.weight)
        nn.init.xavier_normal_(self.position_embedding.weight)
        with torch.no_grad():
            self.item_embedding.weight[0].zero_()

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        length = inputs.shape[1]
        positions = torch.arange(self.max_length - length, self.max_length, device=inputs.device)
        x = self.item_embedding(inputs) * math.sqrt(self.item_embedding.embedding_dim)
        x = self.dropout(x + self.position_embedding(positions))
        mask = _attention_mask(inputs, self.num_heads)
        for block in self.blocks:
            x = block(x, src_mask=mask)
        return self.final_norm(x)

    def scores(self, hidden: torch.Tensor) -> torch.Tensor:
        """Scores ``[..., n_items]`` of the real items (column ``j`` is item index ``j + 1``)."""
        return hidden @ self.item_embedding.weight[1:].T


def _attention_mask(inputs: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Additive mask ``[B * heads, T, T]``: a query sees the earlier real items and always itself, so a
    padding position (which sees only itself) never yields an all-masked row, hence no NaN."""
    length = inputs.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=inputs.device).tril()
    allowed = causal & (inputs != 0)[:, None, :]
    allowed |= torch.eye(length, dtype=torch.bool, device=inputs.device)
    mask = torch.zeros(allowed.shape, dtype=torch.float32, device=inputs.device)
    mask.masked_fill_(~allowed, float("-inf"))
    return mask.repeat_interleave(num_heads, dim=0)


def _left_pad(rows: Sequence[Sequence[int]], length: int) -> torch.Tensor:
    """Rows of item indices left-padded with 0 to the longest row (at most ``length``; longer rows keep
    their last ``length`` items)."""
    width = max(1, min(length, max((len(r) for r in rows), default=1)))
    out = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        tail = list(row)[-width:]
        if tail:
            out[i, width - len(tail) :] = torch.tensor(tail, dtype=torch.long)
    return out


def training_windows(histories: Sequence[Sequence[int]], max_length: int) -> list[list[int]]:
    """Windows of at most ``max_length + 1`` items cut from the end of each history; consecutive windows
    share one item, so every position after a history's first is a target in exactly one window."""
    windows = []
    for seq in histories:
        end = len(seq)
        while end > 1:
            windows.append(list(seq[max(0, end - max_length - 1) : end]))
            end -= max_length
    return windows


@contextmanager
def _torch_threads(threads: int | None) -> Iterator[None]:
    if threads is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class SASRecRecommender:
    """A trained SASRec as a :class:`~peft_grounded.evaluation.peers.Recommender`, with its training record.

    ``train_seconds`` (training and per-epoch validation), ``threads`` (torch threads used), ``best_epoch``
    (1-based, the one whose weights are kept) and ``history`` (per epoch: ``epoch``, ``seconds`` since the
    start, ``loss``, ``valid_recall@10``, ``valid_ndcg@10``).
    """

    name = "SASRec"

    def __init__(
        self,
        model: SASRecModel,
        item_ids: Sequence[str],
        config: SASRecConfig,
        popularity: torch.Tensor,
        *,
        best_epoch: int = 0,
        history: list[dict[str, float]] | None = None,
        train_seconds: float = 0.0,
        threads: int = 1,
    ) -> None:
        self.model = model.eval()
        self.item_ids = list(item_ids)
        self.config = config
        self.popularity = popularity
        self.best_epoch = best_epoch
        self.history = history or []
        self.train_seconds = train_seconds
        self.threads = threads
        self._index = {item: i + 1 for i, item in enumerate(self.item_ids)}

    def indices(self, history: Sequence[str]) -> list[int]:
        """The history as model indices, unknown items skipped."""
        return [self._index[i] for i in history if i in self._index]

    def recommend(self, histories: Sequence[Sequence[str]], k: int) -> list[list[str]]:
        """For each history (oldest first; the last ``max_length`` known items are read), its ``k`` best
        items, history items excluded. A history with no known item gets the most popular training targets."""
        if not _int_at_least(k, 1):
            raise ValueError(f"k must be an integer >= 1, got {k!r}")
        out: list[list[str]] = []
        for scores in self.score_batches(histories):
            top = scores.topk(min(k, scores.shape[1]), dim=1)
            for values, cols in zip(top.values, top.indices, strict=True):
                out.append(
                    [
                        self.item_ids[c]
                        for c, v in zip(cols.tolist(), values.tolist(), strict=True)
                        if v > float("-inf")
                    ]
                )
        return out

    def score_batches(self, histories: Sequence[Sequence[str]]) -> Iterator[torch.Tensor]:
        """The next-item logits of the histories, ``[batch, len(item_ids)]`` in ``item_ids``' order, batch by
        batch, each history's items at ``-inf`` (as :meth:`recommend` ranks them)."""
        if isinstance(histories, str) or any(isinstance(h, str) for h in histories):
            raise TypeError("histories must be a list of item-id lists, one per user (got a string)")
        rows = [self.indices(h) for h in histories]
        with _torch_threads(self.config.threads):
            for start in range(0, len(rows), _SCORE_BATCH):
                batch = rows[start : start + _SCORE_BATCH]
                scores = self._item_scores(batch)
                exclude_seen(scores, [[i - 1 for i in r] for r in batch])
                yield scores

    @torch.no_grad()
    def _item_scores(self, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        """Scores ``[len(rows), n_items]``; rows with no item get the popularity ranking."""
        self.model.eval()
        hidden = self.model(_left_pad(rows, self.model.max_length))[:, -1]
        scores = self.model.scores(hidden)
        empty = [i for i, r in enumerate(rows) if not r]
        if empty:
            scores[empty] = self.popularity.to(scores.dtype)
        return scores

    # ------------------------------------------------------------------------------------------ save / load

    def save(self, directory: str | Path, *, fit_key: str | None = None) -> Path:
        """Write ``sasrec.safetensors`` (weights) and ``sasrec.json`` (config, item ids, training record,
        the weights' SHA-256, ``fit_key`` when given) into ``directory``; each file atomically, the JSON
        last."""
        directory = Path(directory)
        tensors = {f"model.{k}": v.contiguous() for k, v in self.model.state_dict().items()}
        tensors["popularity"] = self.popularity.contiguous()
        blob = save_tensors(tensors)
        atomic_write(directory / WEIGHTS_FILE, blob)
        meta = {
            "format": FORMAT,
            "version": 1,
            "config": asdict(self.config),
            "item_ids": self.item_ids,
            "weights_sha256": hashlib.sha256(blob).hexdigest(),
            "best_epoch": self.best_epoch,
            "history": self.history,
            "train_seconds": self.train_seconds,
            "threads": self.threads,
            **({"fit_key": fit_key} if fit_key else {}),
        }
        atomic_write_text(directory / CONFIG_FILE, json.dumps(meta, indent=1) + "\n")
        return directory

    @classmethod
    def load(cls, directory: str | Path, *, fix: str = SAVE_FIX) -> SASRecRecommender:
        """A recommender :meth:`save` wrote: ``sasrec.json`` checked field by field (a missing, unknown or
        mistyped one is named), the weights against its SHA-256 and their shapes against its config. A file
        that does not load raises :class:`SASRecFileError` (a ``ValueError``) naming it and ``fix``."""
        directory = Path(directory)
        meta_path, weights_path = directory / CONFIG_FILE, directory / WEIGHTS_FILE
        if not meta_path.is_file() or not weights_path.is_file():
            raise FileNotFoundError(
                f"{directory} holds no saved SASRec ({CONFIG_FILE} and {WEIGHTS_FILE}); {fix}"
            )
        meta = _checked_meta(read_json(meta_path, fix=fix), meta_path, fix)
        blob = weights_path.read_bytes()
        if hashlib.sha256(blob).hexdigest() != meta["weights_sha256"]:
            raise SASRecFileError(
                f"{weights_path} does not match {meta_path} (another save's weights, or a copy cut short); {fix}"
            )
        try:
            config = SASRecConfig(**meta["config"])
        except ValueError as err:
            raise SASRecFileError(f"{meta_path}: field 'config': {err}; {fix}") from None
        try:
            tensors = load_tensors(blob)
        except Exception as err:  # a file whose sha256 matches yet is no safetensors: written so by hand
            raise SASRecFileError(f"{weights_path} is not readable ({err}); {fix}") from None
        model = SASRecModel(len(meta["item_ids"]), config)
        state = {k.removeprefix("model."): v for k, v in tensors.items() if k.startswith("model.")}
        _check_tensors(model, state, tensors.get("popularity"), meta_path, weights_path, fix)
        model.load_state_dict(state)
        return cls(
            model,
            meta["item_ids"],
            config,
            tensors["popularity"],
            best_epoch=meta["best_epoch"],
            history=meta["history"],
            train_seconds=meta["train_seconds"],
            threads=meta["threads"],
        )


# the config fields the weights' shapes depend on: a sasrec.json without one cannot say what its weights are
SHAPE_FIELDS = ("hidden_size", "num_blocks", "num_heads", "max_length")


class SASRecFileError(ValueError):
    """A saved SASRec whose files do not load as they are; the message names the file and the fix."""


def _whole(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _item_ids(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(i, str) for i in value)
        and len(set(value)) == len(value)
    )


SASREC_FIELDS = {  # field of sasrec.json -> (what it must be, its check)
    "format": (f"the string {FORMAT!r}", lambda v: v == FORMAT),
    "version": ("the integer 1", lambda v: v == 1 and not isinstance(v, bool)),
    "config": ("an object of SASRecConfig's fields", lambda v: isinstance(v, dict)),
    "item_ids": ("a non-empty list of distinct item-id strings", _item_ids),
    "weights_sha256": ("a sha256 hex string", lambda v: isinstance(v, str) and len(v) == 64),
    "best_epoch": ("an integer >= 0", lambda v: _whole(v, 0)),
    "history": (
        "a list of objects, one per epoch",
        lambda v: isinstance(v, list) and all(isinstance(r, dict) for r in v),
    ),
    "train_seconds": ("a number >= 0", lambda v: _number(v) and v >= 0),
    "threads": ("an integer >= 1", lambda v: _whole(v, 1)),
    "fit_key": ("a string", lambda v: isinstance(v, str)),
}
OPTIONAL_FIELDS = ("fit_key",)  # written by shared_fit's cache only


def _checked_meta(meta: Any, path: Path, fix: str) -> dict[str, Any]:
    """``sasrec.json``'s record, each field checked (and the config's names): a missing, unknown or mistyped
    one is named with ``fix``."""
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        kind = f"format {meta.get('format')!r}" if isinstance(meta, dict) else f"a JSON {type(meta).__name__}"
        raise SASRecFileError(f"{path} is not a saved SASRec (format {FORMAT!r}; it holds {kind}); {fix}")
    missing = [name for name in SASREC_FIELDS if name not in meta and name not in OPTIONAL_FIELDS]
    extra = [name for name in meta if name not in SASREC_FIELDS]
    if missing or extra:
        raise SASRecFileError(f"{path}: missing fields {missing}, unknown fields {extra}; {fix}")
    for name, (wanted, check) in SASREC_FIELDS.items():
        if name in meta and not check(meta[name]):
            raise SASRecFileError(f"{path}: field {name!r} is {meta[name]!r:.60}, not {wanted}; {fix}")
    known = {f.name for f in fields(SASRecConfig)}
    missing = [name for name in SHAPE_FIELDS if name not in meta["config"]]
    extra = [name for name in meta["config"] if name not in known]
    if missing or extra:
        raise SASRecFileError(
            f"{path}: field 'config' lacks {missing} and has unknown fields {extra} (SASRecConfig's are "
            f"{', '.join(sorted(known))}); {fix}"
        )
    return meta


def _check_tensors(
    model: SASRecModel, state: dict[str, Any], popularity: Any, meta_path: Path, weights_path: Path, fix: str
) -> None:
    """Refuse weights whose names or shapes are not those of ``model`` (built from the JSON's config and
    item count), or a popularity vector of another length, naming both files."""
    wanted = {name: tuple(value.shape) for name, value in model.state_dict().items()}
    given = {name: tuple(value.shape) for name, value in state.items()}
    n_items = model.item_embedding.num_embeddings - 1
    wanted["popularity"] = (n_items,)
    given["popularity"] = None if popularity is None else tuple(popularity.shape)
    problems = [
        f"{name}: {given.get(name) or 'missing'}, wanted {shape}"
        for name, shape in wanted.items()
        if given.get(name) != shape
    ] + [f"{name}: not a SASRec weight" for name in given if name not in wanted]
    if problems:
        raise SASRecFileError(
            f"{weights_path} does not hold the weights {meta_path} describes ({n_items} items, hidden_size "
            f"{model.item_embedding.embedding_dim}, {len(model.blocks)} blocks, max_length {model.max_length}): "
            f"{'; '.join(problems[:3])}{f' and {len(problems) - 3} more' if len(problems) > 3 else ''}; {fix}"
        )


# ------------------------------------------------------------------------------------------------ training


def _indexed(split: Any, item_ids: Sequence[str]) -> tuple[dict[str, int], list[list[int]], list[int]]:
    index = {item: i + 1 for i, item in enumerate(item_ids)}
    if len(index) != len(item_ids):
        raise ValueError("item_ids must be unique")
    unknown = {i for u in split.users for i in (*u.history, u.valid) if i not in index}
    if unknown:
        raise ValueError(
            f"{len(unknown)} items of the split's histories or validation targets are not in item_ids "
            f"(e.g. {sorted(unknown)[:3]}); pass the catalogue's item ids (catalogue.item_ids)"
        )
    histories = [[index[i] for i in u.history] for u in split.users]
    valid = [index[u.valid] for u in split.users]
    return index, histories, valid


def _validate(
    recommender: SASRecRecommender, histories: list[list[int]], targets: list[int]
) -> dict[str, float]:
    """Validation Recall@10 and NDCG@10: each history's target ranked among all items, history excluded."""
    hits, gains = 0, 0.0
    for start in range(0, len(histories), _SCORE_BATCH):
        rows, wanted = histories[start : start + _SCORE_BATCH], targets[start : start + _SCORE_BATCH]
        scores = exclude_seen(recommender._item_scores(rows), [[i - 1 for i in r] for r in rows])
        target_scores = scores[torch.arange(len(rows)), torch.tensor(wanted) - 1]
        ranks = (scores > target_scores[:, None]).sum(dim=1)
        for rank, score in zip(ranks.tolist(), target_scores.tolist(), strict=True):
            if rank < 10 and score > float("-inf"):
                hits += 1
                gains += 1.0 / math.log2(rank + 2)
    n = max(1, len(histories))
    return {"valid_recall@10": hits / n, "valid_ndcg@10": gains / n}


def fit_sasrec(
    split: Any,
    item_ids: Sequence[str],
    config: SASRecConfig | None = None,
    *,
    show_progress: bool = False,
) -> SASRecRecommender:
    """Train SASRec on a :class:`~peft_grounded.sids.LeaveOneOut` split over ``item_ids`` (the catalogue's)
    and return the recommender holding the best validation epoch's weights (:func:`~peft_grounded.sids.
    sasrec_cache.shared_fit` reuses an equal fit). ``show_progress``: a progress line on stderr, one update
    per epoch (:func:`epoch_progress`)."""
    config = config or SASRecConfig()
    item_ids = list(item_ids)
    _, histories, valid_targets = _indexed(split, item_ids)
    return _fit(histories, valid_targets, item_ids, config, show_progress=show_progress)


def epoch_progress(
    config: SASRecConfig, epoch: int, seconds: float, metrics: dict[str, float], best_epoch: int, stale: int
) -> str:
    """The progress line's news after ``epoch`` (1-based; ``seconds`` since the start): its validation Recall@10
    and NDCG@10, the best epoch so far and the time left, estimated at the mean epoch's time: until the stop
    that ``patience`` brings if validation does not improve again (each gain puts it off), ``max_epochs`` or
    ``max_minutes`` if sooner."""
    from tqdm import tqdm

    epochs_left = min(config.max_epochs - epoch, config.patience - stale)
    left = epochs_left * seconds / epoch
    if config.max_minutes is not None:
        left = min(left, max(0.0, config.max_minutes * 60 - seconds))
    return (
        f"valid Recall@10 {metrics['valid_recall@10']:.4f} NDCG@10 {metrics['valid_ndcg@10']:.4f}, best epoch "
        f"{best_epoch}, about {tqdm.format_interval(left)} left"
    )


def _fit(
    histories: list[list[int]],
    valid_targets: list[int],
    item_ids: list[str],
    config: SASRecConfig,
    *,
    show_progress: bool = False,
) -> SASRecRecommender:
    windows = training_windows(histories, config.max_length)
    if not windows:
        raise ValueError(
            "no training history has two items, so SASRec has no target to learn; use longer histories"
        )
    chosen = list(range(len(histories)))
    if config.valid_users is not None and config.valid_users < len(chosen):
        chosen = sorted(random.Random(config.seed).sample(chosen, config.valid_users))
    valid_histories = [histories[u] for u in chosen]
    valid_wanted = [valid_targets[u] for u in chosen]
    counts = Counter(i for h in histories for i in h[1:])
    popularity = torch.tensor([float(counts.get(i + 1, 0)) for i in range(len(item_ids))])

    from tqdm.auto import tqdm

    progress = tqdm(
        total=config.max_epochs,
        desc="SASRec",
        unit="epoch",
        bar_format="{desc}: epoch {n_fmt} of at most {total_fmt} [{elapsed}{postfix}]",
        dynamic_ncols=True,
        disable=not show_progress,
    )
    with _torch_threads(config.threads), torch.random.fork_rng(devices=[]), progress:
        torch.manual_seed(config.seed)
        threads = torch.get_num_threads()
        model = SASRecModel(len(item_ids), config)
        recommender = SASRecRecommender(model, item_ids, config, popularity, threads=threads)
        optimiser = torch.optim.Adam(
            model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay
        )
        generator = torch.Generator().manual_seed(config.seed)
        budget = None if config.max_minutes is None else config.max_minutes * 60
        start = time.perf_counter()
        best_value, best_state, stale = -1.0, copy.deepcopy(model.state_dict()), 0
        for epoch in range(1, config.max_epochs + 1):
            model.train()
            total, positions = 0.0, 0
            for batch in torch.randperm(len(windows), generator=generator).split(config.batch_size):
                padded = _left_pad([windows[i] for i in batch.tolist()], config.max_length + 1)
                inputs, targets = padded[:, :-1], padded[:, 1:]
                keep = inputs != 0
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.bf16):
                    logits = model.scores(model(inputs)[keep])
                loss = nn.functional.cross_entropy(logits.float(), targets[keep] - 1)
                optimiser.zero_grad(set_to_none=True)
                loss.backward()
                optimiser.step()
                total += loss.item() * int(keep.sum())
                positions += int(keep.sum())
                if budget is not None and time.perf_counter() - start > budget:
                    break
            metrics = _validate(recommender, valid_histories, valid_wanted)
            seconds = time.perf_counter() - start
            recommender.history.append(
                {"epoch": epoch, "seconds": seconds, "loss": total / positions, **metrics}
            )
            value = metrics[f"valid_{config.valid_metric}"]
            if value > best_value:
                best_value, best_state, stale = value, copy.deepcopy(model.state_dict()), 0
                recommender.best_epoch = epoch
            else:
                stale += 1
            progress.set_postfix_str(
                epoch_progress(config, epoch, seconds, metrics, recommender.best_epoch, stale), refresh=False
            )
            progress.update(1)
            if stale >= config.patience or (budget is not None and seconds > budget):
                break
        model.load_state_dict(best_state)
        model.eval()
        recommender.train_seconds = time.perf_counter() - start
    return recommender


def exclude_seen(scores: Any, histories: Sequence[Sequence[int]]) -> Any:
    """Set the scores of each row's history items (row indices into the item axis) to ``-inf`` in place."""
    for row, seen in enumerate(histories):
        if len(seen):
            scores[row, list(seen)] = float("-inf")
    return scores
