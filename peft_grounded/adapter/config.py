"""``GroundedTokenConfig``: the configuration of a grounded-token adapter."""

from __future__ import annotations

import copy
import hashlib
from dataclasses import InitVar, asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np
import torch
from peft.config import PeftConfig

from .. import checks
from .lora import checked_lora
from .saved import GROUNDED_TOKENS
from .starts import DATA_INITS, INITS, PROJECTIONS, InitName, ProjectionName, check_choice

IN_MEMORY_PREFIX = "in-memory "


def describe_tensor(value: torch.Tensor | np.ndarray) -> str:
    """The JSON record of an in-memory tensor: dtype, shape and a content hash."""
    tensor = torch.as_tensor(value).detach().cpu().contiguous()
    raw = tensor.reshape(-1).view(torch.uint8)  # the bytes of any dtype (numpy has no bfloat16)
    digest = hashlib.sha256(raw.numpy().tobytes()).hexdigest()[:16]
    return f"{IN_MEMORY_PREFIX}{str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)} sha256={digest}"


def _record(value: Any) -> Any:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return describe_tensor(value)
    if isinstance(value, dict):
        return {k: _record(v) for k, v in value.items()}
    return value


@dataclass
class GroundedRuntimeConfig:
    """Runtime data of a grounded-token config: read at creation, never saved (``to_dict`` drops it)."""

    init_vectors: Any = field(
        default=None,
        metadata={
            "help": "centroid: one vector per new token, any width (tensor, array, or path to a .safetensors "
            "file with a `vectors` tensor); tensor: a [n, d_model] matrix; adapter: path of a saved grounded "
            "adapter. A dict {'input': ..., 'output': ...} gives untied heads their own vectors."
        },
    )
    init_anchors: Any = field(
        default=None,
        metadata={
            "help": "centroid with lstsq projection: {'token_ids': [...], 'vectors': [a, d]} (or a .safetensors "
            "path with those keys), the encoder's vectors of existing vocabulary tokens."
        },
    )
    init_texts: list[str] | list[list[int]] | None = field(
        default=None,
        metadata={
            "help": "description: one text per new token, as token ids (strings are tokenised by "
            "initialize_grounded_rows(model, tokenizer=...))."
        },
    )
    rows_from_checkpoint: bool = field(
        default=False,
        metadata={
            "help": "Set by from_pretrained: the rows come from adapter_model.safetensors, so the start is "
            "skipped and the provenance is checked against the base."
        },
    )

    def record(self) -> dict[str, Any] | None:
        """The JSON record of the data given (tensors as dtype, shape and hash); None when there are none."""
        names = ("init_vectors", "init_anchors", "init_texts")
        given = {name: _record(getattr(self, name)) for name in names if getattr(self, name) is not None}
        return given or None


@dataclass
class GroundedProvenance:
    """Facts recorded when the adapter is made, saved with it, and checked when it is loaded onto a base."""

    num_embeddings: int | None = field(
        default=None, metadata={"help": "Rows of the input embedding the adapter was made for."}
    )
    embedding_signature: list[float] | None = field(
        default=None,
        metadata={"help": "Norms of a few fixed rows of the original vocabulary, checked on load."},
    )
    vocab_fingerprint: str | None = field(
        default=None,
        metadata={"help": "sha256 of the original vocabulary's tokens (filled by `add_tokens`)."},
    )
    init_data: dict[str, Any] | None = field(
        default=None,
        metadata={
            "help": "The data the rows started from, described (dtype, shape, hash; paths; token ids)."
        },
    )

    @classmethod
    def coerce(cls, value: Any) -> GroundedProvenance | None:
        """A provenance from itself, its saved dict, or None."""
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, dict):
            unknown = set(value) - {f.name for f in fields(cls)}
            if unknown:
                raise ValueError(
                    f"provenance has unknown keys {sorted(unknown)}; it records {cls.__name__}'s fields."
                )
            return cls(**value)
        raise TypeError(
            f"provenance must be a GroundedProvenance, its dict or None, got {type(value).__name__}."
        )


@dataclass
class GroundedTokenConfig(PeftConfig):
    """Configuration of a grounded-token adapter: trainable rows for the new tokens, every other weight frozen.

    ``init_weights`` means what it means in PEFT: True (the default) starts the rows by ``init``, which without a
    value keeps the embedding's rows (``init="keep"``, a no-op start); False draws random rows, as
    ``TrainableTokensConfig(init_weights=False)`` does. ``runtime_config`` holds the start's data (never saved, as LoRA's) and ``provenance`` the facts recorded at
    creation (saved, checked on load). A data-driven ``init`` takes its data here (``init_vectors``,
    ``init_anchors``, ``init_texts``) or later from :func:`~peft_grounded.adapter.initialize_grounded_rows`, as
    PEFT's EVA does; until then the rows stand at the vocabulary mean. The list :func:`peft_grounded.add_tokens`
    returns, given as ``token_indices``, also fills ``token_strings``, ``original_vocab_size`` and the
    provenance's ``vocab_fingerprint``. A config that already records another base gives a new model a copy.
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
    init: InitName | None = field(
        default=None,
        metadata={
            "help": f"How the new rows start: one of {', '.join(INITS)}. Not given (None): 'keep', the start "
            "init_weights=True means in PEFT (set on creation, so a saved config names it)."
        },
    )
    init_weights: bool = field(
        default=True,
        metadata={
            "help": "PEFT's switch, as in TrainableTokensConfig. True (the default): the rows start by `init`, and "
            "without `init` keep the values the embedding holds (init='keep'), so the wrapped model's outputs are "
            "the base's: PEFT's no-op start (after add_tokens those rows are the vocabulary mean). False: random "
            "rows (torch.randn, the global generator), whatever `init` says: PEFT's non-identity start, for tests."
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
    init_scale: float = field(
        default=1.0,
        metadata={
            "help": "Every computed start (not init='adapter', which copies trained rows): row = mean + init_scale "
            "* (row - mean), the vocabulary mean. 1 keeps the start as computed; below 1 keeps the rows' "
            "directions while the frozen head's distribution over the new tokens starts nearer uniform."
        },
    )
    init_seed: int = field(
        default=0, metadata={"help": "Seed of the random initialisations (gaussian, random)."}
    )
    lora: dict[str, Any] | None = field(
        default=None,
        metadata={
            "help": "The LoRA stacked on the backbone for the task's SFT, as `peft.LoraConfig` keyword arguments "
            "(e.g. {'r': 16, 'lora_alpha': 32, 'target_modules': 'all-linear'}; what `add_lora` records); None: "
            "no LoRA. The LM head and embeddings are never targeted: their new rows are this adapter's own."
        },
    )
    provenance: GroundedProvenance | None = field(
        default=None,
        metadata={
            "help": "Facts recorded when the adapter is made (embedding rows, base signature, vocabulary "
            "fingerprint, the start's data described); filled by get_peft_model, checked on load."
        },
    )
    runtime_config: GroundedRuntimeConfig = field(
        default_factory=GroundedRuntimeConfig,
        compare=False,  # runtime data (tensors): two configs are equal by their hyperparameters and provenance
        metadata={"help": "Runtime data of the start (init_vectors, init_anchors, init_texts); never saved."},
    )
    # The one-liner of a data-driven start: routed into runtime_config, never stored on the config itself.
    init_vectors: InitVar[Any] = None
    init_anchors: InitVar[Any] = None
    init_texts: InitVar[list[str] | list[list[int]] | None] = None

    def __post_init__(self, init_vectors: Any, init_anchors: Any, init_texts: list | None) -> None:
        super().__post_init__()
        self.peft_type = GROUNDED_TOKENS
        self.provenance = GroundedProvenance.coerce(self.provenance)
        if isinstance(self.runtime_config, dict):
            self.runtime_config = GroundedRuntimeConfig(**self.runtime_config)
        given = {"init_vectors": init_vectors, "init_anchors": init_anchors, "init_texts": init_texts}
        given = {k: v for k, v in given.items() if v is not None}
        if given:
            self.runtime_config = replace(self.runtime_config, **given)
        added = self.token_indices
        for attr, name in (("tokens", "token_strings"), ("original_vocab_size", "original_vocab_size")):
            if getattr(self, name) is None and getattr(added, attr, None) is not None:
                setattr(self, name, getattr(added, attr))
        fingerprint = getattr(added, "vocab_fingerprint", None)
        if fingerprint is not None and (self.provenance is None or self.provenance.vocab_fingerprint is None):
            self.provenance = replace(self.provenance or GroundedProvenance(), vocab_fingerprint=fingerprint)
        self.token_indices = self._checked_indices(added)
        if self.token_strings is not None:
            self.token_strings = list(self.token_strings)
            if len(self.token_strings) != len(self.token_indices):
                raise ValueError(
                    f"token_strings has {len(self.token_strings)} entries for {len(self.token_indices)} token indices."
                )
        if self.init is None:  # init_weights=True's start in PEFT (False draws random rows anyway)
            self.init = "keep"
        check_choice("init", self.init, INITS)
        check_choice("centroid_projection", self.centroid_projection, PROJECTIONS)
        if self.tokens_are_new and self.original_vocab_size is not None:
            inside = [i for i in self.token_indices if i < self.original_vocab_size]
            if inside:
                raise ValueError(
                    f"token_indices {inside[:5]} lie inside the original vocabulary (size {self.original_vocab_size}) "
                    "but the tokens are declared new. Add the tokens with peft_grounded.add_tokens and pass the "
                    "indices it returns, or set tokens_are_new=False to re-learn existing tokens."
                )
        checks.raise_problems(
            "GroundedTokenConfig",
            [checks.number_in("init_scale", self.init_scale, 0, low_open=True)],
            "1 keeps the start as computed; init='mean' puts every row at the mean.",
        )
        self.init_scale = float(self.init_scale)
        self.lora = checked_lora(self.lora)

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
        """Whether a data-driven ``init`` has its data in ``runtime_config`` (token ids for ``description``)."""
        runtime = self.runtime_config
        if self.init == "description":
            texts = runtime.init_texts
            return texts is not None and all(isinstance(t, (list, tuple)) for t in texts)
        return self.init not in DATA_INITS or runtime.init_vectors is not None

    @property
    def has_lora(self) -> bool:
        """Whether the adapter carries a stacked LoRA (``lora`` is set)."""
        return self.lora is not None

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready hyperparameters and provenance; ``runtime_config`` is dropped (as LoRA's)."""
        out = {
            f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self) if f.name != "runtime_config"
        }
        if self.provenance is not None:
            out["provenance"] = asdict(self.provenance)
        out["peft_type"] = str(self.peft_type.value if hasattr(self.peft_type, "value") else self.peft_type)
        if out.get("task_type") is not None and hasattr(out["task_type"], "value"):
            out["task_type"] = out["task_type"].value
        return out

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str, subfolder: str | None = None, **kwargs):
        """Load a saved config; its rows will come from the checkpoint, so no start data are needed."""
        config = super().from_pretrained(pretrained_model_name_or_path, subfolder=subfolder, **kwargs)
        config.runtime_config.rows_from_checkpoint = True
        return config

    def record_start(self) -> None:
        """Describe the runtime data of the start in ``provenance.init_data`` (tensors by dtype, shape, hash)."""
        self.provenance = replace(
            self.provenance or GroundedProvenance(), init_data=self.runtime_config.record()
        )


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
