"""Download a grounded-adapter repo's safe files (no pickles, no code) into a local folder, atomically."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .._io import make_temp_dir
from .repo import SAFE_PATTERNS, GroundedHubError, check_adapter_files, load_grounded_config, open_source


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
    output (:func:`~peft_grounded._locks.output_lock`): a second pull into it stops at once.
    """
    from .._locks import output_lock

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
