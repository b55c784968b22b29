"""A base model extended with a SID index's tokens and wrapped with a grounded adapter, fresh or saved."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from .._quiet import peft_wrapping
from ..prompts import PromptFormat


def check_model_dir(model_path: Any, flag: str = "--model_name_or_path") -> str:
    """``model_path`` if it is a local model directory with safetensors weights; else a clear error (a
    missing path would otherwise reach the Hub client as a malformed repo id)."""
    path = Path(str(model_path)).expanduser()
    fix = "pass a local model directory (config.json, *.safetensors and the tokenizer files)"
    if not path.exists():
        raise FileNotFoundError(f"{flag} {model_path}: no such directory; {fix}")
    if not path.is_dir():
        raise ValueError(f"{flag} {model_path} is a file, not a model directory; {fix}")
    if not (path / "config.json").is_file():
        hint = ""
        if (path / "adapter_config.json").is_file():
            hint = " (it holds an adapter: pass it as the adapter and its base model here)"
        raise FileNotFoundError(f"{flag} {model_path} holds no config.json{hint}; {fix}")
    if not any(path.glob("*.safetensors")):
        raise FileNotFoundError(
            f"{flag} {model_path} holds no *.safetensors weights (pickled *.bin weights are never loaded); "
            "convert them with transformers' save_pretrained(safe_serialization=True)"
        )
    return str(path)


@dataclass(frozen=True)
class RowStart:
    """How a fresh adapter's new rows start: the one declaration of these settings, taken by the ``ground`` and
    ``sft`` commands (``--init``, ``--centroid_variant``, ``--init_scale``) and passed down as it is, through
    :func:`~peft_grounded.training.grounding.ground` and :func:`~peft_grounded.training.sft.train_recommender`,
    to :func:`sid_model`."""

    init: Literal["mean", "gaussian", "random", "centroid"] = field(
        default="mean", metadata={"help": "How the new rows start (a fresh adapter)."}
    )
    centroid_variant: Literal["items", "codebook"] = field(
        default="items",
        metadata={
            "help": "init=centroid: the centroid of the items under a code, or the code's codebook vector."
        },
    )
    init_scale: float = field(
        default=1.0,
        metadata={
            "help": "Pull the started rows toward the vocabulary mean: mean + init_scale * (row - mean); below 1 a "
            "centroid start keeps its geometry and starts nearer a uniform distribution over the SIDs."
        },
    )

    def __post_init__(self) -> None:
        from .. import checks

        problem = checks.number_in("init_scale", self.init_scale, 0, low_open=True, flag="--init_scale")
        checks.raise_problems("RowStart", [problem])


def load_base(model_path: str, dtype: torch.dtype = torch.float32):
    """A fresh tokenizer and base model from a local checkpoint (safetensors only)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_path = check_model_dir(model_path)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype, use_safetensors=True)
    return tokenizer, model


def sid_model(
    model_path: str,
    index: Any,
    *,
    start: RowStart | None = None,
    seed: int = 0,
    fmt: PromptFormat | None = None,
    adapter: str | None = None,
    is_trainable: bool = True,
    dtype: torch.dtype = torch.float32,
):
    """``(tokenizer, PeftModel)``: the base with ``index``'s tokens and a grounded adapter.

    With ``adapter`` (a saved grounded adapter), its rows (and LoRA) are loaded after checking that it was
    made for this index; otherwise a fresh adapter starts as ``start`` says (None: :class:`RowStart`'s
    defaults): ``start.init`` (``centroid``: the index's ``start.centroid_variant`` centroids) and
    ``start.init_scale`` (:class:`GroundedTokenConfig`'s). Its SID record (:data:`SID_RECORD`) holds the index
    fingerprint and the prompt format.
    """
    from peft import PeftModel, get_peft_model

    from ..adapter import GroundedTokenConfig, add_tokens

    if adapter is not None:  # the adapter's files and its index are checked before the base loads
        from types import SimpleNamespace

        from ..adapter.saved import read_adapter

        saved = read_adapter(adapter)
        record = read_sid_record(
            adapter
        )  # a record this version cannot read fails here, before the base loads
        index.check_adapter(
            SimpleNamespace(**saved.config),
            where=f"the adapter at {adapter}",
            recorded=record.get(FINGERPRINT_KEY),
        )
    tokenizer, base = load_base(model_path, dtype)
    added = add_tokens(tokenizer, base, index.token_strings)
    if adapter is not None:
        try:
            with peft_wrapping():
                model = PeftModel.from_pretrained(base, adapter, is_trainable=is_trainable)
        except RuntimeError as err:  # e.g. a LoRA whose shapes are not this base's
            lines = [line.strip() for line in str(err).splitlines() if line.strip()]
            first = next((line for line in lines if "size mismatch" in line), lines[0] if lines else "")
            raise ValueError(
                f"the adapter at {adapter} does not fit the base model {model_path} ({first[:300]}); pass the base "
                f"it was trained on with --model_name_or_path (its config records "
                f"{saved.config.get('base_model_name_or_path')!r}), or restore the adapter's files if that is it"
            ) from None
        load_sid_record(model, adapter, record=record)
        return tokenizer, model
    start = start if start is not None else RowStart()
    vectors = None
    if start.init == "centroid":
        tokens, vectors = index.adapter_init(start.centroid_variant)
        if tokens != added.tokens:
            raise ValueError("The SID index's token order differs from the tokens added to the model.")
    config = GroundedTokenConfig(
        token_indices=added,
        init=start.init,
        init_vectors=vectors,
        init_scale=start.init_scale,
        init_seed=seed,
        task_type="CAUSAL_LM",
    )
    with peft_wrapping():
        model = get_peft_model(base, config)
    record_sid_facts(
        model, sid_index_fingerprint=index.fingerprint(), prompt_format=asdict(fmt or PromptFormat())
    )
    return tokenizer, model


def base_model_path(adapter: str, recorded: str | None = None) -> str:
    """The local base model of a saved adapter: its recorded base if that is a directory here, else the
    packaged SmolLM2-135M when the adapter was made on it. ``recorded``: the config's
    ``base_model_name_or_path`` when the caller has read it already (None: read from ``adapter``)."""
    from .. import assets

    if recorded is None:
        from ..adapter.saved import read_adapter_config

        recorded = read_adapter_config(adapter).get("base_model_name_or_path")
    recorded = recorded or ""
    if recorded and Path(recorded).is_dir():
        return recorded
    local = assets.smollm2()
    if recorded in ("", str(local)) or "smollm2" in recorded.lower():
        return str(local)
    raise FileNotFoundError(
        f"The adapter at {adapter} was made on {recorded!r}, which is not a local directory: pass its path "
        "(model_path= / --model_name_or_path)."
    )


SID_RECORD = "sid_record.json"
"""The file beside an adapter (never in its config) where the recommender records what it trained the adapter
for: ``sid_index_fingerprint`` (the SID index its tokens stand for), ``prompt_format`` (how its prompts were
written) and ``sid_softmax`` (True: trained with the SID-only softmax)."""
RECORD_KEYS = ("sid_index_fingerprint", "prompt_format", "sid_softmax")
SID_SOFTMAX_KEY = "sid_softmax"
FINGERPRINT_KEY = "sid_index_fingerprint"


def _records(model) -> dict[str, dict[str, Any]]:
    """adapter name -> its record, kept on the ``PeftModel`` itself (copies and pickles carry it)."""
    return vars(model).setdefault("sid_records", {})


def sid_record(model, adapter_name: str | None = None) -> dict[str, Any]:
    """A copy of the record of ``model``'s adapter (default: the active one); ``{}`` when it has none."""
    if model is None or not hasattr(model, "peft_config"):
        return {}
    name = adapter_name or getattr(model, "active_adapter", None)
    return dict(vars(model).get("sid_records", {}).get(name, {}))


def record_sid_facts(model, adapter_name: str | None = None, **facts: Any) -> None:
    """Set facts of the record of ``model``'s adapter (a ``None`` value removes the fact)."""
    unknown = sorted(set(facts) - set(RECORD_KEYS))
    if unknown:
        raise ValueError(f"a SID record holds {', '.join(RECORD_KEYS)}; not {unknown}")
    name = adapter_name or model.active_adapter
    record = _records(model).setdefault(name, {})
    for key, value in facts.items():
        if value is None:
            record.pop(key, None)
        else:
            record[key] = value


def save_sid_record(model, directory: str | Path, adapter_name: str | None = None) -> None:
    """Write the record of ``model``'s adapter into ``directory`` (:data:`SID_RECORD`, atomically); an adapter
    without a record writes none (and removes a stale one)."""
    import json

    from .._io import atomic_write_text

    record = sid_record(model, adapter_name)
    path = Path(directory) / SID_RECORD
    if record:
        atomic_write_text(path, json.dumps(record, indent=2, sort_keys=True) + "\n")
    elif path.is_file():
        path.unlink()


def read_sid_record(directory: str | Path) -> dict[str, Any]:
    """The record saved beside the adapter in ``directory`` (``{}`` when there is none), checked."""
    from .._io import read_json

    path = Path(directory) / SID_RECORD
    if not path.is_file():
        return {}
    fix = "restore the file the adapter was saved with, or delete it (the adapter then records nothing)"
    record = read_json(path, fix=fix)
    if not isinstance(record, dict) or set(record) - set(RECORD_KEYS):
        raise ValueError(f"{path} is not a SID record (an object of {', '.join(RECORD_KEYS)}); {fix}")
    if record.get("prompt_format"):  # a format this version cannot read fails here, naming the file
        PromptFormat.from_record(record["prompt_format"], str(path))
    return record


def load_sid_record(
    model, directory: str | Path, adapter_name: str | None = None, record: dict[str, Any] | None = None
) -> None:
    """Attach the record saved in ``directory`` to ``model``'s adapter (replacing what it had); ``record``: the
    one :func:`read_sid_record` already read from there (None: read it now). A folder without one is
    remembered, so that decoding says which normalisation it assumed (:func:`sid_softmax_of`)."""
    name = adapter_name or model.active_adapter
    _records(model)[name] = dict(read_sid_record(directory) if record is None else record)
    missing = vars(model).setdefault("sid_records_missing", {})
    if (Path(directory) / SID_RECORD).is_file():
        missing.pop(name, None)
    else:
        missing[name] = str(directory)


def sid_softmax_of(model) -> bool:
    """Whether ``model``'s active adapter was trained with the SID-only softmax (its record says so, written
    by :class:`~peft_grounded.training.sft.RecommendationTrainer`). Without a record: False, the whole
    vocabulary, which is what an adapter trained by any other trainer learnt; one loaded from a folder without
    its record says so in a warning, since an adapter of this package's SFT that lost its record was trained
    otherwise."""
    folder = vars(model).get("sid_records_missing", {}).get(getattr(model, "active_adapter", None))
    if folder is not None:
        import warnings

        warnings.warn(
            f"the adapter loaded from {folder} has no {SID_RECORD} beside it: decoding over the whole vocabulary, "
            "as a PEFT-trained adapter learnt. An adapter of peft-grounded sft trained with the SID-only softmax "
            f"needs its {SID_RECORD} back (or pass sid_softmax=True)",
            UserWarning,
            stacklevel=2,
        )
    return bool(sid_record(model).get(SID_SOFTMAX_KEY))


def prompt_format_of(model, default: PromptFormat | None = None) -> PromptFormat:
    """The prompt format the model's adapter records (else ``default`` or the standard one)."""
    recorded = sid_record(model).get("prompt_format")
    if recorded:
        return PromptFormat.from_record(recorded)
    return default or PromptFormat()


def model_for(
    index: Any,
    model: Any = None,
    tokenizer: Any = None,
    *,
    model_path: str | None = None,
    caller: str,
    start: RowStart | None = None,
    seed: int = 0,
    fmt: PromptFormat | None = None,
    adapter: str | None = None,
    dtype: torch.dtype = torch.float32,
):
    """``(tokenizer, model)`` for a training entry point: the live ``model`` it was given (already wrapped for
    ``index``; it needs its ``tokenizer``), or a fresh :func:`sid_model` of ``model_path`` (default: the
    packaged SmolLM2-135M) with ``start``, ``seed``, ``fmt``, ``adapter`` and ``dtype``."""
    if model is None:
        from .. import assets

        path = model_path or str(assets.smollm2())
        return sid_model(path, index, start=start, seed=seed, fmt=fmt, adapter=adapter, dtype=dtype)
    if tokenizer is None:
        raise ValueError(
            f"{caller}(model=...) needs the model's tokenizer (with the SID tokens): pass tokenizer=."
        )
    return tokenizer, model


PEFT_DEFAULT = "peft_default"  # the strategy name of this path in the experiment runner


def peft_default_model(
    model_path: str,
    index: Any,
    lora: dict[str, Any],
    *,
    dtype: torch.dtype = torch.float32,
):
    """``(tokenizer, PeftModel)``: ``index``'s tokens added the plain way, rows mean-resized, and a PEFT
    ``LoraConfig`` (``lora``: its arguments) whose ``trainable_token_indices`` are the new tokens."""
    from peft import LoraConfig, get_peft_model

    tokenizer, base = load_base(model_path, dtype)
    tokens = list(index.token_strings)
    tokenizer.add_tokens(tokens, special_tokens=False)
    base.resize_token_embeddings(len(tokenizer), mean_resizing=True)
    ids = tokenizer.convert_tokens_to_ids(tokens)
    if len(set(ids)) != len(tokens) or tokenizer.unk_token_id in ids:
        raise ValueError("some SID tokens did not become single new tokens of the tokenizer")
    config = LoraConfig(
        task_type="CAUSAL_LM",
        trainable_token_indices={"embed_tokens": ids},
        **lora,
    )
    with peft_wrapping():
        return tokenizer, get_peft_model(base, config)


def is_peft_default(model: Any) -> bool:
    """Whether ``model`` is a PEFT LoRA model training new tokens through ``trainable_token_indices``."""
    from peft import LoraConfig

    config = getattr(model, "peft_config", {}).get(getattr(model, "active_adapter", None))
    return isinstance(config, LoraConfig) and bool(config.trainable_token_indices)
