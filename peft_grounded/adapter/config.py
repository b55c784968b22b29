"""``GroundedTokenConfig``: the configuration of a grounded-token adapter."""

from __future__ import annotations

import hashlib
import inspect
from dataclasses import InitVar, dataclass, field, fields
from typing import Any

import numpy as np
import torch
from peft import LoraConfig
from peft.config import PeftConfig

from ..init.projection import PROJECTIONS
from ..init.sources import IN_MEMORY_PREFIX
from ..init.strategies import DATA_INITS, INITS
from .registration import GROUNDED_TOKENS

RUNTIME_TENSOR_FIELDS = ("init_vectors", "init_anchors")
# LoraConfig options the grounded adapter sets itself, or does not support on its stacked LoRA (extra trainable
# weights, data-driven initialisations that rewrite the frozen backbone, runtime objects that are not JSON).
LORA_OPTIONS_REFUSED = (
    "peft_type",
    "task_type",
    "inference_mode",
    "base_model_name_or_path",
    "revision",
    "modules_to_save",
    "trainable_token_indices",
    "target_parameters",
    "layer_replication",
    "runtime_config",
    "loftq_config",
    "eva_config",
    "corda_config",
    "megatron_config",
)
LORA_INITS = (True, False, "gaussian")
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

    Data-dependent initialisations take their data from ``init_vectors`` / ``init_texts`` /
    ``init_anchors``. Tensors given there are used once, when the adapter is created, and are recorded
    in ``adapter_config.json`` as a description (dtype, shape, hash), not as values: a saved adapter's
    rows come from ``adapter_model.safetensors``.

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
        init_texts (`list`, *optional*): description: one text (or list of token ids) per new token.
        tokenizer_name_or_path (`str`, *optional*): description: the tokenizer for string `init_texts`.
        init_anchors (*optional*): centroid with lstsq: encoder vectors of existing vocabulary tokens.
        centroid_projection (`str`): centroid: auto, truncate, pca or lstsq.
        norm_match (`bool`): centroid: scale deviations to the vocabulary's RMS deviation.
        init_seed (`int`): seed of the gaussian and random initialisations.
        num_embeddings (`int`, *optional*): input-embedding rows the adapter was made for (filled at creation).
        embedding_signature (`list[float]`, *optional*): norms of fixed base rows, checked on load (filled at creation).
        vocab_fingerprint (`str`, *optional*): sha256 of the original vocabulary's tokens (filled by `add_tokens`).
        sid_index_fingerprint (`str`, *optional*): the SID index the tokens stand for; evaluation refuses another.
        prompt_format (`dict`, *optional*): the recommendation prompt format, reused by evaluation.
        lora (`dict`, *optional*): the stacked LoRA as `peft.LoraConfig` keyword arguments (set by `add_lora`);
            None without LoRA. Configs saved with the former `lora_r`, `lora_alpha`, `lora_dropout` and
            `lora_target_modules` fields still load: those are mapped onto `lora`.
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
    init: str = field(
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
            "help": "description: one text per new token (e.g. the titles of the items under a SID code), or "
            "the token ids of each text. Strings need `tokenizer_name_or_path`."
        },
    )
    tokenizer_name_or_path: str | None = field(
        default=None,
        metadata={"help": "description: local tokenizer used to tokenise `init_texts` strings."},
    )
    init_anchors: Any = field(
        default=None,
        metadata={
            "help": "centroid with lstsq projection: {'token_ids': [...], 'vectors': [a, d]} (or a .safetensors "
            "path with those keys), the encoder's vectors of existing vocabulary tokens."
        },
    )
    centroid_projection: str = field(
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
    sid_index_fingerprint: str | None = field(
        default=None,
        metadata={
            "help": "Fingerprint of the SID index whose codes the tokens stand for (SIDIndex.fingerprint()); "
            "evaluation, further training and diagnostics refuse another index."
        },
    )
    prompt_format: dict | None = field(
        default=None,
        metadata={
            "help": "How recommendation prompts were written (PromptFormat fields), reused by evaluation."
        },
    )
    lora: dict[str, Any] | None = field(
        default=None,
        metadata={
            "help": "The LoRA stacked on the backbone for the task's SFT, as `peft.LoraConfig` keyword arguments "
            "(e.g. {'r': 16, 'lora_alpha': 32, 'target_modules': 'all-linear'}; what `add_lora` records); None: "
            "no LoRA. The LM head and embeddings are never targeted: their new rows are this adapter's own."
        },
    )
    peft_grounded: str = field(
        default=LOAD_HINT,
        repr=False,
        compare=False,
        metadata={"help": "How to load this adapter (a note for readers of adapter_config.json; not used)."},
    )
    # Adapters saved before `lora` replaced these four fields carry them in adapter_config.json: accepted at
    # construction (hence by every loader) and mapped onto `lora`, never stored or saved.
    lora_r: InitVar[int | None] = None
    lora_alpha: InitVar[int | None] = None
    lora_dropout: InitVar[float | None] = None
    lora_target_modules: InitVar[list[str] | str | None] = None

    def __post_init__(
        self,
        lora_r: int | None,
        lora_alpha: int | None,
        lora_dropout: float | None,
        lora_target_modules: list[str] | str | None,
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
        legacy = _legacy_lora(lora_r, lora_alpha, lora_dropout, lora_target_modules)
        if legacy is not None and self.lora is not None:
            raise ValueError(
                "Give the LoRA once: `lora` and the old `lora_r`/`lora_target_modules` fields both set."
            )
        self.lora = checked_lora(legacy if legacy is not None else self.lora)
        if self.init in DATA_INITS and self.init != "description" and self.init_vectors is None:
            raise ValueError(f"init={self.init!r} needs init_vectors.")
        if self.init == "description" and self.init_texts is None:
            raise ValueError("init='description' needs init_texts (one text per new token).")

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


def checked_lora(lora: Any) -> dict[str, Any] | None:
    """``lora`` as a JSON-ready dict of ``peft.LoraConfig`` keyword arguments, checked; None stays None."""
    if lora is None:
        return None
    if isinstance(lora, LoraConfig):
        raise TypeError(
            "lora takes LoraConfig keyword arguments as a dict (e.g. {'r': 16, 'target_modules': ...})."
        )
    if not isinstance(lora, dict):
        raise TypeError(
            f"lora must be a dict of peft.LoraConfig keyword arguments or None, got {type(lora).__name__}."
        )
    allowed = set(inspect.signature(LoraConfig).parameters)
    unknown = sorted(set(lora) - allowed)
    if unknown:
        raise ValueError(f"lora has keys that peft.LoraConfig does not take: {unknown}.")
    refused = sorted(k for k in lora if k in LORA_OPTIONS_REFUSED and lora[k] is not None)
    if lora.get("bias", "none") != "none":
        refused.append("bias")
    if lora.get("init_lora_weights", True) not in LORA_INITS:
        refused.append("init_lora_weights")
    if refused:
        raise ValueError(
            f"lora sets {refused}, which the grounded adapter does not support on its stacked LoRA: task type and mode "
            "come from the adapter, the new rows are its only other trainable weights, the backbone stays as loaded "
            f"(init_lora_weights: one of {LORA_INITS}), and the config is saved as JSON."
        )
    if not lora.get("target_modules"):
        raise ValueError("lora needs target_modules (e.g. 'all-linear' or ['q_proj', 'v_proj']).")
    from .. import checks

    checks.raise_problems(
        "lora",
        [
            checks.int_at_least("r", lora.get("r", 8), 1, flag="--lora-r"),
            checks.number_in("lora_alpha", lora.get("lora_alpha", 8), 0, low_open=True, flag="--lora-alpha"),
            checks.number_in(
                "lora_dropout", lora.get("lora_dropout", 0.0), 0, 1, high_open=True, flag="--lora-dropout"
            ),
        ],
    )
    out = dict(lora)
    if isinstance(out["target_modules"], (set, frozenset, tuple)):
        out["target_modules"] = sorted(out["target_modules"])
    LoraConfig(**out)  # LoraConfig's own checks (r > 0, dropout range, ...) now, not at injection
    return out


def _legacy_lora(
    r: int | None, alpha: int | None, dropout: float | None, targets: list[str] | str | None
) -> dict[str, Any] | None:
    """The ``lora`` dict of a config written with the old ``lora_r``/``lora_alpha``/``lora_dropout``/
    ``lora_target_modules`` fields (their old defaults: 0 = no LoRA, alpha 16, dropout 0)."""
    if r is None or r == 0:
        return None
    if r < 0:
        raise ValueError(f"lora_r must be >= 0, got {r}.")
    if not targets:
        raise ValueError("lora_r > 0 needs lora_target_modules (e.g. 'all-linear' or ['q_proj', 'v_proj']).")
    return {
        "r": r,
        "lora_alpha": 16 if alpha is None else alpha,
        "lora_dropout": 0.0 if dropout is None else dropout,
        "target_modules": targets,
    }
