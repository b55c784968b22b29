"""Atomic file writes, for every module: a temporary file in the target's folder, flushed, then ``os.replace``.

Readers see the old file or the whole new one, never a part. The file gets the permissions an ordinary
``open(path, "w")`` would give (``0o666`` minus the umask), not the ``0o600`` of ``mkstemp``; folders
filled beside their target (:func:`make_temp_dir`) those of ``mkdir``, not the ``0o700`` of ``mkdtemp``.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

# errors of a full disk or a file-size limit, as errno values and as the words other layers (Rust, torch) use
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT})
DISK_FULL_WORDS = (
    "no space left",
    "file too large",
    "disk quota",
    "os error 28",  # Rust (safetensors, tokenizers): ENOSPC
    "os error 27",  # Rust: EFBIG
    "file write failed",  # torch.save's zip writer on a failed write
    "unexpected pos",  # torch.save's zip writer on a short write
)


class DiskFullError(OSError):
    """A write failed for lack of space (a full disk, a quota, a file-size limit); the message says what was
    kept and how to go on (``errno`` is the original one)."""

    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.errno = getattr(cause, "errno", None) or errno.ENOSPC


def is_disk_full(error: BaseException | None) -> bool:
    """Whether ``error`` (or an exception it was raised from) is a full disk, a quota or a file-size limit."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in DISK_FULL_ERRNOS:
            return True
        if any(word in str(error).lower() for word in DISK_FULL_WORDS):
            return True
        error = error.__cause__ or error.__context__
    return False


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# Read once, at import: os.umask can only be read by setting it, which would race with other threads.
_UMASK = _read_umask()


def atomic_write(path: str | os.PathLike[str], write: Callable[[BinaryIO], object] | bytes) -> Path:
    """Write ``path`` atomically from bytes or a ``write(file)`` callback; creates the parent folders.

    A full disk raises :class:`DiskFullError` naming ``path``, which keeps its previous content; a folder that
    cannot be written, a ``PermissionError`` naming it."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as err:
        if err.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        raise PermissionError(
            f"cannot write {path}: {path.parent} is not writable ({err.strerror}); choose a folder you can "
            "write, or fix its permissions"
        ) from err
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
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if is_disk_full(err) and not isinstance(err, DiskFullError):
            raise DiskFullError(
                f"no space to write {path} ({err}); it was left as it was before. Free disk space (or raise "
                "the quota), then run the command again",
                err,
            ) from err
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


def swap_dir_into_place(new: Path, directory: Path) -> None:
    """Replace ``directory`` by the finished ``new`` one (the old copy survives as ``.<name>.old`` until the
    new one is in place)."""
    old = directory.with_name(f".{directory.name}.old")
    if directory.exists():
        shutil.rmtree(old, ignore_errors=True)
        directory.rename(old)
    new.rename(directory)
    shutil.rmtree(old, ignore_errors=True)
