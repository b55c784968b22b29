"""``GroundedTokenConfig``: the configuration of a grounded-token adapter."""

from __future__ import annotations

import hashlib
from dataclasses import InitVar, dataclass, field, fields
from typing import Any

import numpy as np
import torch
from peft.config import PeftConfig

from ..init.projection import PROJECTIONS, ProjectionName
from ..init.sources import IN_MEMORY_PREFIX
from ..init.strategies import DATA_INITS, INITS, InitName
from .lora_settings import checked_lora, legacy_lora
from .registration import GROUNDED_TOKENS

RUNTIME_TENSOR_FIELDS = ("init_vectors", "init_anchors")
# Saved in adapter_config.json next to "peft_type" (sorted keys), for whoever opens it after PEFT failed
# without the plugin: PEFT raises a bare KeyError: 'GROUNDED_TOKENS' then (see docs/peft_trl_limitations.md).
LOAD_HINT = (
    "A peft_grounded adapter (peft_type GROUNDED_TOKENS): `pip install peft-grounded`, then `import "
    "peft_grounded` before PEFT loads it; without that import PEFT raises KeyError: 'GROUNDED_TOKENS'."
)


def describe_tensor(value: torch.Tensor | np.ndarray) -> str:
    """The JSON record of an in-memory tensor: dtype, shape and a content hash."""
    tensor = torch.as_tensor(value).detach().cpu().contiguous()
    raw = tensor.reshape(-1).view(torch.uint8)  # the bytes of any dtype (numpy has no bfloat16)
    digest = hashlib.sha256(raw.numpy().tobytes()).hexdigest()[:16]
    return f"{IN_MEMORY_PREFIX}{str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)} sha256={digest}"


@dataclass
class GroundedTokenConfig(PeftConfig):
    """Configuration of a grounded-token adapter: a trainable delta on the rows of new tokens only.

    The adapter wraps the input embedding (and, for untied models, the output head) so that the rows of
    ``token_indices`` come from small trainable matrices while every other weight stays frozen and
    bit-identical. ``init`` chooses how those rows start (see :mod:`peft_grounded.init.strategies`).

    Like ``LoraConfig``, a config is JSON-able hyperparameters and can be applied to several models:
    ``get_peft_model`` works on its own copy, so what creation fills in (``num_embeddings``,
    ``embedding_signature``, ``target_modules``) lands on the model's config, never on the caller's object.

    **Data-driven starts** (``centroid``, ``tensor``, ``adapter``, ``description``) take their data in one of two
    ways. The one-liner passes them in the config, ``GroundedTokenConfig(init="centroid", init_vectors=...)``:
    they are used once, at creation, and recorded in ``adapter_config.json`` as a description (dtype, shape,
    hash), never as values. Or, PEFT's EVA convention (``init_lora_weights="eva"`` +
    ``initialize_lora_eva_weights(model, dataloader)``): the config names the start only, the rows stand at the
    vocabulary mean (with a warning) until :func:`~peft_grounded.adapter.initialize_grounded_rows` gives the
    data, ``initialize_grounded_rows(model, vectors=...)``. That path serves data made from the wrapped model
    or its tokenizer (description texts are tokenised there, never inside ``get_peft_model``) and keeps the
    config itself free of tensors. A saved adapter's rows always come from ``adapter_model.safetensors``.

    Passing the list returned by :func:`peft_grounded.add_tokens` as ``token_indices`` also fills
    ``token_strings``, ``original_vocab_size`` and ``vocab_fingerprint``.

    Args:
        task_type (`str`): PEFT task type, `CAUSAL_LM` (default) or `SEQ_2_SEQ_LM`.
        token_indices (`list[int]`): row indices of the new tokens, as returned by `add_tokens`.
        token_strings (`list[str]`, *optional*): the tokens at those indices, checked against a tokenizer.
        tokens_are_new (`bool`): the indices lie beyond the original vocabulary; False re-learns existing rows.
        original_vocab_size (`int`, *optional*): vocabulary size before the extension (statistics come from below).
        target_modules (`str`, *optional*): the input-embedding module; default `get_input_embeddings()`.
        output_module (`str`, *optional*): the untied output head; default `get_output_embeddings()`.
        train_output_rows (`bool`): untied heads also get trainable output rows.
        init (`str`): how the rows start: mean, gaussian, random, description, centroid, tensor or adapter.
        init_vectors (*optional*): centroid / tensor / adapter data (tensor, array or path); used once, recorded as a hash.
        init_texts (`list`, *optional*): description: the token ids of one text per new token (strings are
            tokenised by `initialize_grounded_rows(model, tokenizer=...)`).
        init_anchors (*optional*): centroid with lstsq: encoder vectors of existing vocabulary tokens.
        centroid_projection (`str`): centroid: auto, truncate, pca or lstsq.
        norm_match (`bool`): centroid: scale deviations to the vocabulary's RMS deviation.
        init_seed (`int`): seed of the gaussian and random initialisations.
        num_embeddings (`int`, *optional*): input-embedding rows the adapter was made for (filled at creation).
        embedding_signature (`list[float]`, *optional*): norms of fixed base rows, checked on load (filled at creation).
        vocab_fingerprint (`str`, *optional*): sha256 of the original vocabulary's tokens (filled by `add_tokens`).
        lora (`dict`, *optional*): the stacked LoRA as `peft.LoraConfig` keyword arguments (set by `add_lora`);
            None without LoRA.
        metadata (`dict`, *optional*): what the application records and the adapter never reads: the SID index
            its tokens stand for (`sid_index_fingerprint`, which evaluation checks) and the recommendation
            `prompt_format`, both also readable as attributes.

    Configs of earlier releases still load: their `lora_r`, `lora_alpha`, `lora_dropout` and `lora_target_modules`
    are mapped onto `lora`, their `sid_index_fingerprint` and `prompt_format` onto `metadata`, and their
    `tokenizer_name_or_path` (no tokenizer is loaded at creation any more) is dropped.
    """

    task_type: str | None = field(
        default="CAUSAL_LM",
        metadata={"help": "PEFT task type; CAUSAL_LM (the default) wraps the model in PeftModelForCausalLM."},
    )
    token_indices: list[int] = field(
        default_factory=list,
        metadata={"help": "Row indices of the new tokens (as returned by `peft_grounded.add_tokens`)."},
    )
    token_strings: list[str] | None = field(
        default=None,
        metadata={
            "help": "The token strings at `token_indices`, checked against a tokenizer when one is given."
        },
    )
    tokens_are_new: bool = field(
        default=True,
        metadata={
            "help": "The tokens extend the vocabulary: their indices must lie at or beyond `original_vocab_size`. "
            "Set to False to re-learn rows of existing tokens."
        },
    )
    original_vocab_size: int | None = field(
        default=None,
        metadata={
            "help": "Size of the vocabulary before the extension; statistics for `mean`/`gaussian`/`centroid` "
            "come from rows below it. Default: the smallest new index (new tokens are appended)."
        },
    )
    target_modules: str | list[str] | None = field(
        default=None,
        metadata={
            "help": "Name of the input-embedding module to wrap. Default: `model.get_input_embeddings()`."
        },
    )
    output_module: str | None = field(
        default=None,
        metadata={
            "help": "Name of the output head for untied models. Default: `model.get_output_embeddings()`."
        },
    )
    train_output_rows: bool = field(
        default=True,
        metadata={"help": "Untied heads: also give the new tokens trainable output rows (x2 parameters)."},
    )
    init: InitName = field(
        default="mean",
        metadata={"help": f"How the new rows start: one of {', '.join(INITS)}."},
    )
    init_vectors: Any = field(
        default=None,
        metadata={
            "help": "centroid: one vector per new token, any width (tensor, array, or path to a .safetensors "
            "file with a `vectors` tensor); tensor: a [n, d_model] matrix; adapter: path of a saved grounded "
            "adapter. A dict {'input': ..., 'output': ...} gives untied heads their own vectors."
        },
    )
    init_texts: list[str] | list[list[int]] | None = field(
        default=None,
        metadata={
            "help": "description: the token ids of one text per new token (e.g. the titles of the items under a SID "
            "code); strings are tokenised by initialize_grounded_rows(model, tokenizer=...)."
        },
    )
    init_anchors: Any = field(
        default=None,
        metadata={
            "help": "centroid with lstsq projection: {'token_ids': [...], 'vectors': [a, d]} (or a .safetensors "
            "path with those keys), the encoder's vectors of existing vocabulary tokens."
        },
    )
    centroid_projection: ProjectionName = field(
        default="auto",
        metadata={
            "help": "centroid: truncate (MRL encoders, d >= d_model), pca (principal axes onto the vocabulary's), "
            "lstsq (map fitted on init_anchors), or auto: lstsq with anchors, truncate when wide enough, else pca."
        },
    )
    norm_match: bool = field(
        default=True,
        metadata={
            "help": "centroid: scale the mean-shifted vectors so their RMS deviation from the vocabulary mean "
            "equals the vocabulary rows' (one global factor; keeps all cosine ratios)."
        },
    )
    init_seed: int = field(
        default=0, metadata={"help": "Seed of the random initialisations (gaussian, random)."}
    )
    num_embeddings: int | None = field(
        default=None,
        metadata={
            "help": "Rows of the input embedding the adapter was made for (filled when the adapter is created)."
        },
    )
    embedding_signature: list[float] | None = field(
        default=None,
        metadata={
            "help": "Norms of a few fixed rows of the original vocabulary, filled at creation and checked on load "
            "to catch a different base model."
        },
    )
    vocab_fingerprint: str | None = field(
        default=None,
        metadata={"help": "sha256 of the original vocabulary's token strings (filled by `add_tokens`)."},
    )
    lora: dict[str, Any] | None = field(
        default=None,
        metadata={
            "help": "The LoRA stacked on the backbone for the task's SFT, as `peft.LoraConfig` keyword arguments "
            "(e.g. {'r': 16, 'lora_alpha': 32, 'target_modules': 'all-linear'}; what `add_lora` records); None: "
            "no LoRA. The LM head and embeddings are never targeted: their new rows are this adapter's own."
        },
    )
    metadata: dict[str, Any] | None = field(
        default=None,
        metadata={
            "help": "What the application records (the adapter never reads it): sid_index_fingerprint, the SID "
            "index whose codes the tokens stand for (evaluation, further training and diagnostics refuse another "
            "index), and prompt_format, how recommendation prompts were written (reused by evaluation)."
        },
    )
    peft_grounded: str = field(
        default=LOAD_HINT,
        repr=False,
        compare=False,
        metadata={"help": "How to load this adapter (a note for readers of adapter_config.json; not used)."},
    )
    # Fields of earlier releases, found in the adapter_config.json they saved: accepted at construction (hence by
    # every loader), mapped onto `lora` and `metadata` (tokenizer_name_or_path: dropped), never stored or saved.
    lora_r: InitVar[int | None] = None
    lora_alpha: InitVar[int | None] = None
    lora_dropout: InitVar[float | None] = None
    lora_target_modules: InitVar[list[str] | str | None] = None
    sid_index_fingerprint: InitVar[str | None] = None
    prompt_format: InitVar[dict | None] = None
    tokenizer_name_or_path: InitVar[str | None] = None

    def __post_init__(
        self,
        lora_r: int | None,
        lora_alpha: int | None,
        lora_dropout: float | None,
        lora_target_modules: list[str] | str | None,
        sid_index_fingerprint: str | None,
        prompt_format: dict | None,
        tokenizer_name_or_path: str | None,
    ) -> None:
        super().__post_init__()
        self.peft_type = GROUNDED_TOKENS
        added = self.token_indices
        for attr, name in (
            ("tokens", "token_strings"),
            ("original_vocab_size", "original_vocab_size"),
            ("vocab_fingerprint", "vocab_fingerprint"),
        ):
            if getattr(self, name) is None and getattr(added, attr, None) is not None:
                setattr(self, name, getattr(added, attr))
        self.token_indices = self._checked_indices(added)
        if self.token_strings is not None:
            self.token_strings = list(self.token_strings)
            if len(self.token_strings) != len(self.token_indices):
                raise ValueError(
                    f"token_strings has {len(self.token_strings)} entries for {len(self.token_indices)} token indices."
                )
        if self.init not in INITS:
            raise ValueError(f"Unknown init {self.init!r}; choose one of {', '.join(INITS)}.")
        if self.centroid_projection not in PROJECTIONS:
            raise ValueError(
                f"Unknown centroid_projection {self.centroid_projection!r}; choose one of {', '.join(PROJECTIONS)}."
            )
        if self.tokens_are_new and self.original_vocab_size is not None:
            inside = [i for i in self.token_indices if i < self.original_vocab_size]
            if inside:
                raise ValueError(
                    f"token_indices {inside[:5]} lie inside the original vocabulary (size {self.original_vocab_size}) "
                    "but the tokens are declared new. Add the tokens with peft_grounded.add_tokens and pass the "
                    "indices it returns, or set tokens_are_new=False to re-learn existing tokens."
                )
        legacy = legacy_lora(lora_r, lora_alpha, lora_dropout, lora_target_modules)
        if legacy is not None and self.lora is not None:
            raise ValueError(
                "Give the LoRA once: `lora` and the old `lora_r`/`lora_target_modules` fields both set."
            )
        self.lora = checked_lora(legacy if legacy is not None else self.lora)
        recorded = {"sid_index_fingerprint": sid_index_fingerprint, "prompt_format": prompt_format}
        recorded = {k: v for k, v in recorded.items() if v is not None}
        if recorded or self.metadata is not None:
            self.metadata = {**(self.metadata or {}), **recorded}

    @staticmethod
    def _checked_indices(indices: Any) -> list[int]:
        values = [_index(i) for i in indices]
        if not values:
            raise ValueError("token_indices is empty: pass the indices of the new tokens (see add_tokens).")
        if any(i < 0 for i in values):
            raise ValueError(f"token_indices must be >= 0, got {[i for i in values if i < 0][:5]}.")
        seen: set[int] = set()
        duplicated = sorted({i for i in values if i in seen or seen.add(i)})
        if duplicated:
            raise ValueError(
                f"token_indices lists {duplicated[:5]} more than once; each new token needs one row."
            )
        return values

    @property
    def base_vocab_size(self) -> int:
        """Rows of the vocabulary the new tokens extend: statistics and the signature come from below it."""
        if self.original_vocab_size is not None:
            return self.original_vocab_size
        return min(self.token_indices) if self.tokens_are_new else max(self.token_indices) + 1

    @property
    def has_init_data(self) -> bool:
        """Whether a data-driven ``init`` has its data here (token ids for ``description``); without them the
        rows start at the vocabulary mean until :func:`~peft_grounded.adapter.initialize_grounded_rows`."""
        if self.init == "description":
            return self.init_texts is not None and all(isinstance(t, (list, tuple)) for t in self.init_texts)
        return self.init not in DATA_INITS or self.init_vectors is not None

    @property
    def has_lora(self) -> bool:
        """Whether the adapter carries a stacked LoRA (``lora`` is set)."""
        return self.lora is not None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; in-memory init tensors become a description (dtype, shape, hash)."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in RUNTIME_TENSOR_FIELDS:
                value = _record(value)
            out[f.name] = value
        out["peft_type"] = str(self.peft_type.value if hasattr(self.peft_type, "value") else self.peft_type)
        if out.get("task_type") is not None and hasattr(out["task_type"], "value"):
            out["task_type"] = out["task_type"].value
        return out

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str, subfolder: str | None = None, **kwargs):
        """Load a saved config; its rows will come from the checkpoint, so init data are not required."""
        config = super().from_pretrained(pretrained_model_name_or_path, subfolder=subfolder, **kwargs)
        config.rows_from_checkpoint = True
        return config

    # Set by from_pretrained. Deliberately unannotated: a class attribute, not a dataclass field, so it is
    # never serialised.
    rows_from_checkpoint = False


def _recorded(key: str) -> property:
    """``config.<key>`` reads and writes ``config.metadata[key]`` (the attribute of earlier releases)."""

    def get(self: GroundedTokenConfig) -> Any:
        return (self.metadata or {}).get(key)

    def set(self: GroundedTokenConfig, value: Any) -> None:
        self.metadata = {**(self.metadata or {}), key: value}

    return property(get, set, doc=f"``metadata[{key!r}]`` (None when not recorded).")


# After the dataclass is made: the constructor keeps accepting these names (InitVar above), reads and writes go
# to `metadata`.
GroundedTokenConfig.sid_index_fingerprint = _recorded("sid_index_fingerprint")  # type: ignore[assignment]
GroundedTokenConfig.prompt_format = _recorded("prompt_format")  # type: ignore[assignment]


def _index(value: Any) -> int:
    """A token index as an int; floats (even 10.0), bools and strings are refused rather than truncated."""
    if isinstance(value, torch.Tensor) and value.ndim == 0 and not value.is_floating_point():
        value = value.item()
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    raise ValueError(
        f"token_indices must be integer row indices, got {value!r} ({type(value).__name__}). Pass ints, e.g. the "
        "list returned by peft_grounded.add_tokens (or integer_tensor.tolist())."
    )


def _record(value: Any) -> Any:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return describe_tensor(value)
    if isinstance(value, dict):
        return {k: _record(v) for k, v in value.items()}
    return value
