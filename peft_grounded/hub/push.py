"""Push a grounded adapter (or the LoRA-stacked artefact) to the Hub in one commit.

The repo gets ``adapter_config.json`` and ``adapter_model.safetensors`` as PEFT's ``save_pretrained``
writes them (the new tokens' rows and any LoRA, never the full embedding), the model card
(``README.md``), the SID index in ``sid_index/`` when given, and the extended tokenizer when given.
The tokens to add to a base tokenizer are the config's ``token_strings`` (in row order), with the base
vocabulary's size and fingerprint (``original_vocab_size``, ``vocab_fingerprint``): the config is the
one record of them.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from huggingface_hub.constants import REPOCARD_NAME

from ..sids.extended_base import FINGERPRINT_KEY, SID_RECORD, read_sid_record, save_sid_record
from .repo import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    FUSION_FILES,
    RULE_FILES,
    SID_INDEX_DIR,
    GroundedHubError,
    check_adapter_files,
    check_repo_id,
    load_grounded_config,
)

if TYPE_CHECKING:
    from huggingface_hub import CommitInfo
    from peft import PeftModel

    from ..adapter import GroundedTokenConfig
    from ..sids.index import SIDIndex
    from .card import GroundedCardFacts

DEFAULT_COMMIT_MESSAGE = "Upload grounded adapter (peft_grounded)"
# What a push replaces on the Hub, and only for what it was given: the adapter's weights in any format (e.g.
# a stale pickled adapter_model.bin) always, the SID index folder only when an index is pushed.
ADAPTER_WEIGHT_FILES = f"{Path(ADAPTER_WEIGHTS).stem}.*"
INDEX_FILES = f"{SID_INDEX_DIR}/*"


def replaced_patterns(with_index: bool) -> list[str]:
    """The Hub files a push deletes before it uploads: never any it is not given a replacement for."""
    own = [
        ADAPTER_WEIGHT_FILES,
        "new_item_rule.*",
        *FUSION_FILES,
    ]  # a rule, a fusion: fitted for this adapter
    return [*own, INDEX_FILES] if with_index else own


def push_grounded(
    model: PeftModel | str | Path,
    repo_id: str,
    *,
    tokenizer=None,
    index: SIDIndex | str | Path | None = None,
    card_facts: GroundedCardFacts | Mapping[str, Any] | None = None,
    private: bool = False,
    commit_message: str = DEFAULT_COMMIT_MESSAGE,
    token: str | bool | None = None,
    revision: str | None = None,
    adapter_name: str | None = None,
) -> CommitInfo:
    """Push the grounded adapter of ``model`` (a ``PeftModel``, or a folder saved by its ``save_pretrained``)
    to ``repo_id`` in one commit; returns the commit's info (``.commit_url``, ``.oid``).

    ``tokenizer``: the extended tokenizer, checked against the adapter and pushed alongside. ``index``: a
    :class:`~peft_grounded.sids.SIDIndex` (or its folder), stored in ``sid_index/``. ``card_facts``: model
    card facts (see :class:`~peft_grounded.hub.card.GroundedCardFacts`, e.g. ``{"metrics": {...}}``) over
    those derived from the adapter; ``base_model`` must be a Hub id, and defaults to the config's.
    ``revision``: a branch, created if missing. Creates the repo if needed (``private`` applies then).
    """
    from huggingface_hub import HfApi

    check_repo_id(repo_id)
    with tempfile.TemporaryDirectory(prefix="grounded-push-") as tmp:
        stage = Path(tmp) / "repo"
        stage.mkdir()
        config = stage_adapter(model, stage, adapter_name)
        overrides = card_facts if card_facts is not None else {}
        base_model = _base_model_id(config, overrides)
        _pin_base_model(stage, base_model)
        if tokenizer is not None:
            stage_tokenizer(config, tokenizer, stage)
        sid_index = stage_index(config, index, stage) if index is not None else None
        pointer = f'`{SID_INDEX_DIR}/` in this repo (`peft_grounded.hub.load_sid_index("{{repo}}")`)'

        def card(resolved_id: str) -> None:
            from .card import derive_card_facts, render_model_card

            facts = derive_card_facts(
                config,
                base_model=base_model,
                repo_id=resolved_id,
                index=sid_index,
                index_pointer=pointer.format(repo=resolved_id) if sid_index is not None else None,
                overrides=overrides,
            )
            render_model_card(facts).save(str(stage / REPOCARD_NAME))

        card(repo_id)  # every local check and the card render before the repo is created
        api = HfApi()
        resolved = api.create_repo(repo_id, private=private, exist_ok=True, token=token).repo_id
        if resolved != repo_id:
            card(resolved)
        if revision is not None:
            api.create_branch(resolved, branch=revision, exist_ok=True, token=token)
        return api.upload_folder(
            repo_id=resolved,
            folder_path=stage,
            commit_message=commit_message,
            revision=revision,
            token=token,
            delete_patterns=replaced_patterns(index is not None),
        )


def stage_adapter(
    model: PeftModel | str | Path, stage: Path, adapter_name: str | None = None
) -> GroundedTokenConfig:
    """Write the adapter's config and safetensors weights into ``stage``; check them; return the config."""
    if isinstance(model, (str, os.PathLike)):
        if adapter_name is not None:
            raise GroundedHubError("adapter_name applies to a PeftModel; a saved folder holds one adapter.")
        folder = Path(model).expanduser()
        if not folder.is_dir():
            raise GroundedHubError(f"No adapter folder {str(folder)!r}.")
        files = sorted(p.relative_to(folder).as_posix() for p in folder.iterdir() if p.is_file())
        check_adapter_files(files, f"folder {str(folder)!r}")
        for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
            shutil.copyfile(folder / name, stage / name)
        for name in (SID_RECORD, *RULE_FILES, *FUSION_FILES):  # the SID record, the rule, the peer fusion
            if (folder / name).is_file():
                shutil.copyfile(folder / name, stage / name)
    else:
        _save_model(model, stage, adapter_name)
        save_sid_record(model, stage, adapter_name)
    config = load_grounded_config(stage, "adapter")
    check_rows_only(stage / ADAPTER_WEIGHTS, config)
    return config


def _save_model(model: PeftModel, stage: Path, adapter_name: str | None) -> None:
    from ..adapter import GroundedTokenConfig

    peft_config = getattr(model, "peft_config", None)
    if not isinstance(peft_config, dict) or not hasattr(model, "save_pretrained"):
        raise GroundedHubError(
            f"push_grounded takes a PeftModel with a grounded adapter (or its saved folder), got {type(model).__name__}."
        )
    name = adapter_name or model.active_adapter
    if not isinstance(peft_config.get(name), GroundedTokenConfig):
        raise GroundedHubError(f"Adapter {name!r} of this model is not a grounded-token adapter.")
    saved = stage / "saved"
    # PEFT's own save path; save_embedding_layers stays "auto", which peft_grounded resolves to False.
    model.save_pretrained(str(saved), selected_adapters=[name], safe_serialization=True)
    folder = saved if name == "default" else saved / name  # PEFT puts other adapters in a subfolder
    for file in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
        os.replace(folder / file, stage / file)
    shutil.rmtree(saved)


def check_rows_only(path: Path, config: GroundedTokenConfig) -> None:
    """Raise if the safetensors file holds base weights (e.g. the full embedding), or rows of the wrong count.

    A grounded adapter's file holds its new-token rows (``grounded_*``) and, when stacked, LoRA matrices
    (``lora_*``); anything else is a base weight saved by mistake.
    """
    from safetensors import safe_open

    n = len(config.token_indices)
    with safe_open(str(path), "pt") as handle:
        shapes = {key: handle.get_slice(key).get_shape() for key in handle.keys()}  # noqa: SIM118
    foreign = {k: s for k, s in shapes.items() if ".grounded_" not in k and ".lora_" not in k}
    if foreign:
        key, shape = next(iter(foreign.items()))
        raise GroundedHubError(
            f"{path.name} holds a base-model tensor ({key}: {shape}), e.g. the full embedding saved with the "
            "adapter. Save with save_embedding_layers='auto' or False; a grounded adapter needs only its rows."
        )
    rows = {k: s for k, s in shapes.items() if ".grounded_" in k}
    if not rows or any(s[0] != n for s in rows.values()):
        raise GroundedHubError(
            f"{path.name} does not hold the {n} new-token rows the config lists (found {rows or 'none'})."
        )


def _base_model_id(config: GroundedTokenConfig, overrides: GroundedCardFacts | Mapping[str, Any]) -> str:
    given = overrides.get("base_model") if isinstance(overrides, Mapping) else overrides.base_model
    base = given or config.base_model_name_or_path
    source = "card_facts['base_model']" if given else "the adapter's base_model_name_or_path"
    if not base:
        raise GroundedHubError(
            "The adapter does not record its base model: pass card_facts={'base_model': '<hub id of the base>'}."
        )
    try:
        check_repo_id(base)
    except GroundedHubError:
        raise GroundedHubError(
            f"{source} is {base!r}, not a Hub model id (a local path?). The card and the pushed config name the "
            "base by its Hub id: pass card_facts={'base_model': 'org/name'}."
        ) from None
    return base


def _pin_base_model(stage: Path, base_model: str) -> None:
    """Record the base's Hub id in the pushed config (it may hold a local path), so that others can load it."""
    path = stage / ADAPTER_CONFIG
    raw = json.loads(path.read_text(encoding="utf-8"))
    if raw.get("base_model_name_or_path") != base_model:
        raw["base_model_name_or_path"] = base_model
        path.write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def stage_tokenizer(config: GroundedTokenConfig, tokenizer, stage: Path) -> None:
    """Check that ``tokenizer`` carries the adapter's tokens at its rows over the same base, and save it."""
    from ..adapter import check_tokenizer

    try:
        check_tokenizer(config, tokenizer)
    except ValueError as err:
        raise GroundedHubError(f"The tokenizer does not match the adapter: {err}") from None
    tokenizer.save_pretrained(str(stage))


def public_index(index: SIDIndex) -> SIDIndex:
    """``index`` as pushed: its catalogue record keeps the name and the fingerprint, never a local path."""
    from dataclasses import replace

    from ..sids.catalogue_source import RECORD_KEY, source_of

    source = source_of(index)
    if source is None:
        return index
    return replace(index, build_config=index.build_config | {RECORD_KEY: source.public().to_dict()})


def stage_index(config: GroundedTokenConfig, index: SIDIndex | str | Path, stage: Path) -> SIDIndex:
    """Check that the index's SID tokens are the adapter's, and save it into ``stage/sid_index``."""
    from ..sids.index import SIDIndex
    from .repo import check_index_version

    if not isinstance(index, SIDIndex):
        index = SIDIndex.load(index)
    known = set(config.token_strings or [])
    missing = [t for t in index.token_strings if t not in known]
    if config.token_strings is not None and missing:
        raise GroundedHubError(
            f"The SID index uses {len(missing)} tokens the adapter does not have (e.g. {missing[0]!r}): it belongs "
            "to another SID vocabulary."
        )
    check_index_version(read_sid_record(stage).get(FINGERPRINT_KEY), index, "push")
    public_index(index).save(stage / SID_INDEX_DIR)
    return index
