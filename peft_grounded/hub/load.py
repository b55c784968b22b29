"""Load a grounded adapter from the Hub (or a folder) in one call: check the base, add the tokens, load.

:func:`pull_grounded` (below) downloads a repo's safe files (no pickles, no code) into a local folder,
atomically.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from .._io import make_temp_dir
from .repo import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    SAFE_PATTERNS,
    SID_INDEX_DIR,
    GroundedHubError,
    check_adapter_files,
    fetch_adapter,
    load_grounded_config,
    open_source,
)

if TYPE_CHECKING:
    from peft import PeftModel
    from torch import nn

    from ..adapter import GroundedTokenConfig
    from ..sids.index import SIDIndex


def load_grounded(
    base_model: nn.Module,
    tokenizer,
    repo_id_or_path: str | Path,
    *,
    revision: str | None = None,
    adapter_name: str = "default",
    is_trainable: bool = False,
    token: str | bool | None = None,
) -> PeftModel:
    """Load the grounded adapter at ``repo_id_or_path`` (Hub repo id or local folder) onto ``base_model``.

    Fetches ``adapter_config.json``, ``adapter_model.safetensors`` and the SID record only (a repo with pickled weights
    only is refused before any download), checks that ``base_model`` and ``tokenizer`` are the ones the
    adapter was made for, adds the adapter's tokens to both, in order (``peft_grounded.add_tokens``;
    skipped for a tokenizer that already carries them at the adapter's rows), then returns
    ``PeftModel.from_pretrained``. Nothing is modified when a check fails.
    """
    source, folder, config = fetch_adapter(repo_id_or_path, revision=revision, token=token)
    return attach_grounded(
        base_model,
        tokenizer,
        folder,
        config,
        source.where,
        adapter_name=adapter_name,
        is_trainable=is_trainable,
    )


def attach_grounded(
    base_model: nn.Module,
    tokenizer,
    folder: str | Path,
    config: GroundedTokenConfig,
    where: str,
    *,
    adapter_name: str = "default",
    is_trainable: bool = False,
    record: dict | None = None,
) -> PeftModel:
    """:func:`load_grounded` of a local ``folder`` whose config was already read
    (:func:`~.repo.load_grounded_config`): its weights checked, the base and tokenizer made ready, and the
    adapter loaded with that config (PEFT reads no config file again) and its SID record (``record``, when
    already read; else read here)."""
    from peft import PeftModel

    check_readable(Path(folder) / ADAPTER_WEIGHTS)
    prepare_base(config, base_model, tokenizer, where=where)
    from .._quiet import peft_wrapping
    from ..sids.extended_base import load_sid_record

    with peft_wrapping():
        model = PeftModel.from_pretrained(
            base_model, str(folder), adapter_name=adapter_name, is_trainable=is_trainable, config=config
        )
    load_sid_record(model, folder, adapter_name, record=record)
    return model


def load_sid_index(
    repo_id_or_path: str | Path, *, revision: str | None = None, token: str | bool | None = None
) -> SIDIndex:
    """The SID index (item -> SID) stored next to an adapter, in its ``sid_index/`` folder."""
    from ..sids.index import JSON_NAME

    source = open_source(repo_id_or_path, revision=revision, token=token)
    if source.folder is None and f"{SID_INDEX_DIR}/{JSON_NAME}" not in source.files:
        raise _no_index(source.where)
    folder = source.fetch((f"{SID_INDEX_DIR}/*",))
    recorded = None
    if ADAPTER_CONFIG in source.files:  # the index must be the version the adapter was trained or grown on
        from ..sids.extended_base import FINGERPRINT_KEY, SID_RECORD, read_sid_record

        record = read_sid_record(source.fetch((SID_RECORD,))) if SID_RECORD in source.files else {}
        recorded = record.get(FINGERPRINT_KEY)
    return stored_index(folder, source.where, recorded)


def stored_index(folder: Path, where: str, recorded: str | None = None) -> SIDIndex:
    """The index in ``folder``'s ``sid_index/`` (a folder, or a link to one), checked to be the version
    (fingerprint ``recorded``, from the adapter's SID record, already read; None: unchecked) the adapter was
    trained or grown on."""
    from ..sids.index import JSON_NAME, SIDIndex
    from .repo import check_index_version

    link = Path(folder) / SID_INDEX_DIR
    if not (link / JSON_NAME).is_file():
        if link.is_symlink():
            raise GroundedHubError(
                f"{link} is a link to {os.readlink(link)}, which holds no SID index ({JSON_NAME}): point it at "
                "the index's folder, or pass the index (sid_index=..., --sid_index DIR)"
            )
        raise _no_index(where)
    index = SIDIndex.load(link)
    if recorded is not None:
        check_index_version(recorded, index, where)
    return index


def _no_index(where: str) -> GroundedHubError:
    from ..sids.index import JSON_NAME

    return GroundedHubError(
        f"The {where} has no SID index ({SID_INDEX_DIR}/{JSON_NAME}); its model card may say where the index is."
    )


def check_readable(path: Path) -> None:
    """Raise, naming ``path``, unless it opens as a whole safetensors file (a truncated download or copy
    fails here, before the base model is changed)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as weights:
            weights.keys()
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise GroundedHubError(
            f"{path} cannot be read ({err}): truncated or corrupted; save the adapter again (or pull it again)"
        ) from None


def _name(model: nn.Module) -> str:
    return getattr(getattr(model, "config", None), "_name_or_path", None) or type(model).__name__


def check_base(config: GroundedTokenConfig, model: nn.Module, where: str = "adapter") -> None:
    """Raise unless ``model`` has the base vocabulary rows (embedding signature) the adapter was made on."""
    from ..adapter import GroundedProvenance
    from ..adapter.model import embedding_signature, signature_matches

    wanted = config.base_model_name_or_path or "its base model"
    weight = model.get_input_embeddings().weight
    rows, original = weight.shape[0], config.base_vocab_size
    fix = f"Load {wanted!r} and pass it as the base model."
    if rows < original:
        raise GroundedHubError(
            f"The {where} was made for {wanted!r}, with a {original}-token base vocabulary; the given base "
            f"({_name(model)!r}) has only {rows} embedding rows. {fix}"
        )
    made = config.provenance or GroundedProvenance()
    if made.num_embeddings is not None and rows > made.num_embeddings:
        raise GroundedHubError(
            f"The {where} was made for {wanted!r} with {made.num_embeddings} embedding rows once its tokens are "
            f"added; the given base ({_name(model)!r}) already has {rows}. Pass the base model as loaded, without "
            f"added tokens or resizing. {fix}"
        )
    if made.embedding_signature is not None:
        signature = embedding_signature(weight, original)
        expected = made.embedding_signature
        if not signature_matches(expected, signature):
            raise GroundedHubError(
                f"The {where} was made for base model {wanted!r}, but the given base ({_name(model)!r}) has other "
                f"vocabulary rows (embedding signature {signature} vs {expected}). {fix}"
            )


def check_base_tokenizer(config: GroundedTokenConfig, tokenizer, where: str = "adapter") -> bool:
    """Check ``tokenizer``'s base vocabulary; return True if it still lacks the adapter's tokens (they can be
    added at the adapter's rows), False if it already carries them there."""
    from ..adapter import check_tokenizer, vocab_fingerprint

    wanted = config.base_model_name_or_path or "its base model"
    tokens, original = config.token_strings, config.original_vocab_size
    fix = f"Pass {wanted!r}'s own tokenizer, as loaded."
    recorded = getattr(config.provenance, "vocab_fingerprint", None)
    known = recorded is not None and original is not None
    if known and (len(tokenizer) < original or vocab_fingerprint(tokenizer, original) != recorded):
        raise GroundedHubError(
            f"The tokenizer's base vocabulary differs from the one the {where} was made with ({original} "
            f"tokens of {wanted!r}, fingerprint {recorded[:19]}...). {fix}"
        )
    vocab = tokenizer.get_vocab()
    present = [t for t in tokens if t in vocab]
    if len(present) == len(tokens):
        try:
            check_tokenizer(config, tokenizer)
        except ValueError as err:
            raise GroundedHubError(f"{err} {fix}") from None
        return False
    if present:
        raise GroundedHubError(
            f"The tokenizer already has {len(present)} of the {where}'s {len(tokens)} tokens (e.g. {present[0]!r}). "
            f"{fix}"
        )
    start = len(tokenizer)
    if list(config.token_indices) != list(range(start, start + len(tokens))):
        raise GroundedHubError(
            f"Added to this tokenizer ({start} tokens), the {where}'s tokens would land on rows {start}..., but the "
            f"adapter owns rows {min(config.token_indices)}...: the tokenizer has other added tokens. {fix}"
        )
    return True


def prepare_base(config: GroundedTokenConfig, model: nn.Module, tokenizer, where: str = "adapter") -> None:
    """Make ``model`` and ``tokenizer`` ready for the adapter: all checks first, then add the tokens (in order)
    to both and size the embedding to the adapter's ``num_embeddings``."""
    from ..adapter import add_tokens

    if hasattr(model, "peft_config"):
        raise GroundedHubError(
            "The base model already carries a PEFT adapter; pass the plain base model (e.g. from "
            "AutoModelForCausalLM.from_pretrained) or merge_and_unload() it first."
        )
    if not config.token_strings:
        raise GroundedHubError(
            f"The {where} does not list its token strings (token_strings in {where}'s config), so its tokens "
            "cannot be added; add them yourself and use peft.PeftModel.from_pretrained."
        )
    check_base(config, model, where)
    tokens_missing = check_base_tokenizer(config, tokenizer, where)
    rows_before = model.get_input_embeddings().weight.shape[0]
    if tokens_missing:
        added = add_tokens(tokenizer, model, config.token_strings)
        if list(added) != list(config.token_indices):  # guarded by check_base_tokenizer; never silently wrong
            raise GroundedHubError(f"The tokens landed on rows {added[:3]}..., not on the {where}'s rows.")
    _size_embedding(config, model, rows_before)


def _size_embedding(config: GroundedTokenConfig, model: nn.Module, rows_before: int) -> None:
    """Grow the embedding (and head) to the adapter's ``num_embeddings`` and set the new tokens' base rows to
    the vocabulary mean, as ``add_tokens`` does (the rows an untied head without trained rows keeps)."""
    from ..adapter.initialize import fill_with_mean

    target = getattr(config.provenance, "num_embeddings", None) or max(config.token_indices) + 1
    if model.get_input_embeddings().weight.shape[0] < target:
        model.resize_token_embeddings(target, mean_resizing=False)
    if not config.tokens_are_new:
        return
    reference = min(config.original_vocab_size or min(config.token_indices), rows_before)
    embedding = model.get_input_embeddings().weight
    fill_with_mean(embedding, list(config.token_indices), reference)
    head = model.get_output_embeddings()
    if head is not None and head.weight is not embedding:
        fill_with_mean(head.weight, list(config.token_indices), reference)


# Download a grounded-adapter repo's safe files (no pickles, no code) into a local folder, atomically.


def pull_grounded(
    repo_id: str,
    local_dir: str | Path,
    *,
    revision: str | None = None,
    token: str | bool | None = None,
    overwrite: bool = False,
) -> Path:
    """Download the adapter, card, SID index and tokenizer files of ``repo_id`` (``*.json``,
    ``*.safetensors``, ``*.md``, ``*.txt``, ``*.jinja``) into ``local_dir``; returns it.

    The folder appears complete or not at all (download beside it, then rename). An existing non-empty
    ``local_dir`` is replaced only with ``overwrite=True``. The folder is locked as every writer locks its
    output (:func:`~peft_grounded._io.output_lock`): a second pull into it stops at once.
    """
    from .._io import output_lock

    target = Path(local_dir).expanduser()
    _check_target(target)  # before the lock, which is made beside the folder
    with output_lock(target, "pull"):
        return _pull(repo_id, target, revision, token, overwrite)


def _check_target(target: Path) -> None:
    """Refuse a target that is a file (``overwrite`` replaces folders only) or lies under one."""
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise GroundedHubError(
            f"{str(target)!r} is {'a link' if target.is_symlink() else 'a file'}, not a folder; pull into a folder "
            "(--overwrite replaces folders only)."
        )
    existing = next(p for p in target.absolute().parents if p.exists())
    if not existing.is_dir():
        raise GroundedHubError(
            f"{str(existing)!r} is a file, so no folder {str(target)!r} can be made; pull into a folder."
        )


def _pull(
    repo_id: str, target: Path, revision: str | None, token: str | bool | None, overwrite: bool
) -> Path:
    _check_target(target)
    if target.exists() and any(target.iterdir()) and not overwrite:
        raise GroundedHubError(
            f"{str(target)!r} exists and is not empty; pass overwrite=True (--overwrite) to replace it, or another folder."
        )
    source = open_source(repo_id, revision=revision, token=token)
    if source.folder is not None:
        raise GroundedHubError(f"{repo_id!r} is a local folder already; pull takes a Hub repo id.")
    check_adapter_files(list(source.files), source.where)
    tmp = make_temp_dir(target)
    try:
        source.fetch(SAFE_PATTERNS, local_dir=tmp)
        shutil.rmtree(tmp / ".cache", ignore_errors=True)  # huggingface_hub's download bookkeeping
        load_grounded_config(tmp, source.where)
        if target.exists():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
