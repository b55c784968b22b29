"""Atomic file writes, for every module: a temporary file in the target's folder, flushed, then ``os.replace``.

Readers see the old file or the whole new one, never a part. The file gets the permissions an ordinary
``open(path, "w")`` would give (``0o666`` minus the umask), not the ``0o600`` of ``mkstemp``; folders
filled beside their target (:func:`make_temp_dir`) those of ``mkdir``, not the ``0o700`` of ``mkdtemp``.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# Read once, at import: os.umask can only be read by setting it, which would race with other threads.
_UMASK = _read_umask()


def atomic_write(path: str | os.PathLike[str], write: Callable[[BinaryIO], object] | bytes) -> Path:
    """Write ``path`` atomically from bytes or a ``write(file)`` callback; creates the parent folders."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            if isinstance(write, bytes):
                f.write(write)
            else:
                write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def make_temp_dir(target: str | os.PathLike[str]) -> Path:
    """An empty folder beside ``target`` to fill and then rename onto it, with the permissions of an ordinary
    ``mkdir`` (``0o777`` minus the umask), not the ``0o700`` of ``mkdtemp``."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    os.chmod(tmp, 0o777 & ~_UMASK)
    return tmp


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """UTF-8 ``text`` to ``path``, atomically."""
    return atomic_write(path, text.encode("utf-8"))


class FileFormatError(ValueError):
    """A file that cannot be parsed (bad bytes, bad JSON); the message names the file."""


def read_json(path: str | os.PathLike[str], fix: str = "fix the file, or restore a good copy") -> Any:
    """The JSON value in ``path``; bad UTF-8 or bad JSON raise :class:`FileFormatError` naming the file and
    the place (a missing or unreadable file raises the ``OSError``, which names it too)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as err:
        raise FileFormatError(f"{path} is not UTF-8 text (byte {err.start}: {err.reason}); {fix}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise FileFormatError(
            f"{path} is not valid JSON (line {err.lineno}, column {err.colno}: {err.msg}; truncated or "
            f"corrupted?); {fix}"
        ) from None
