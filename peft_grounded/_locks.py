"""One writer per output folder: a lock file with the owner's pid, held with ``fcntl.flock``.

Every command that writes a folder (build-sids, add-items, ground, sft, grow-adapter, evaluate, diagnose,
demo) holds :func:`output_lock` on it from its first check to its last write, so a second process aimed
at the same folder stops at once with :class:`OutputBusyError`, naming the folder and the holder's pid,
instead of both finishing and one silently replacing the other's files.

The lock file sits beside the folder (``<parent>/.<name>.peft_grounded.lock``), so the folder itself holds
only what the command writes and a refused command creates nothing; when the parent is not writable (an
output folder directly in a read-only place) it sits inside the folder. The kernel drops a ``flock`` when
its process dies: a lock file left by a killed run is taken over, with a message naming the dead pid.
Locks are re-entrant within a process (a demo holds its folder while its stages lock their sub-folders)
and taken by the main process of a distributed launch only (the other ranks write under its lock).
"""

from __future__ import annotations

import errno
import fcntl
import functools
import inspect
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

LOCK_SUFFIX = ".peft_grounded.lock"
_held: dict[tuple[int, Path], list] = {}  # (pid, lock path) -> [fd, depth]; the pid keeps forks apart

F = TypeVar("F", bound=Callable[..., Any])


class OutputBusyError(OSError):
    """Another process is writing the output folder (``errno`` EBUSY)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.errno = errno.EBUSY


def lock_path(folder: str | os.PathLike[str]) -> Path:
    """Where the lock of ``folder`` lives: beside it, or inside it when its parent is not writable."""
    folder = Path(folder).expanduser().resolve()
    existing = folder.parent  # the parent may not exist yet: the command creates it
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if folder.parent != folder and os.access(existing, os.W_OK):
        return folder.parent / f".{folder.name}{LOCK_SUFFIX}"
    return folder / LOCK_SUFFIX


def _is_main_process() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def _read_owner(path: Path, attempts: int = 20) -> dict:
    """The holder's record; an empty file (the holder is writing it right now) is read again briefly."""
    for _ in range(attempts):
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return {}
        if text.strip():
            try:
                record = json.loads(text)
            except json.JSONDecodeError:
                return {}
            return record if isinstance(record, dict) else {}
        time.sleep(0.01)
    return {}


def _describe(owner: dict) -> str:
    pid = owner.get("pid", "unknown")
    parts = [f"pid {pid}"]
    if owner.get("command"):
        parts.append(f"`{owner['command']}`")
    if owner.get("host") and owner.get("host") != socket.gethostname():
        parts.append(f"on {owner['host']}")
    if owner.get("started"):
        parts.append(f"since {owner['started']}")
    return ", ".join(parts)


def _busy(folder: Path, owner: dict) -> OutputBusyError:
    return OutputBusyError(
        f"{folder} is being written by another peft-grounded process ({_describe(owner)}); two writers "
        "would mix or replace each other's files. Wait for it to finish, or choose another output folder."
    )


def _try_flock(fd: int) -> bool | None:
    """True: locked; False: another process holds it; None: this filesystem has no flock."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as err:
        if err.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
            return None
        raise
    return True


def _acquire(folder: Path, path: Path, command: str) -> int:
    """Lock ``path`` for ``folder``; returns the open descriptor (raises :class:`OutputBusyError`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(50):  # a holder may unlink the file between our open and our flock: open it again
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except PermissionError as err:
            raise PermissionError(
                f"cannot create the lock file {path} for {folder} ({err.strerror}): choose an output folder "
                "you can write"
            ) from None
        locked = _try_flock(fd)
        previous = _read_owner(path, attempts=1 if locked else 20)
        if locked is False or (
            locked is None
            and previous.get("pid") not in (None, os.getpid())
            and _pid_alive(int(previous["pid"]))
        ):
            os.close(fd)
            raise _busy(folder, previous)
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
            continue
        if previous.get("pid") not in (None, os.getpid()):
            state = "no longer running" if not _pid_alive(int(previous["pid"])) else "no longer holding it"
            logger.warning(
                "%s: took over the lock left by %s (%s; a killed or crashed run)",
                folder,
                _describe(previous),
                state,
            )
        record = {
            "pid": os.getpid(),
            "command": command,
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "folder": str(folder),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode("utf-8"), 0)
        return fd
    raise _busy(folder, _read_owner(path))


@contextmanager
def output_lock(folder: str | os.PathLike[str], command: str) -> Iterator[Path]:
    """Hold the lock of ``folder`` (which need not exist yet) while the block runs; yields the lock file.

    Raises :class:`OutputBusyError` at once if another process holds it. Re-entrant within a process; a
    no-op on the non-main processes of a distributed launch (``RANK`` > 0).
    """
    target = Path(folder).expanduser().resolve()
    path = lock_path(target)
    if not _is_main_process():
        yield path
        return
    key = (os.getpid(), path)
    if key in _held:
        _held[key][1] += 1
        try:
            yield path
        finally:
            _held[key][1] -= 1
        return
    fd = _acquire(target, path, command)
    _held[key] = [fd, 1]
    try:
        yield path
    finally:
        del _held[key]
        try:
            path.unlink(missing_ok=True)  # unlinked while still locked: a waiting opener sees a new inode
        finally:
            os.close(fd)


def locks_output(parameter: str, command: str) -> Callable[[F], F]:
    """Decorator: call the function under :func:`output_lock` of its argument ``parameter`` (when not None);
    ``"args.output_dir"`` names an attribute of an argument."""
    name, _, attribute = parameter.partition(".")

    def decorate(function: F) -> F:
        signature = inspect.signature(function)

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            folder = bound.arguments.get(name)
            if attribute and folder is not None:
                folder = getattr(folder, attribute, None)
            if folder is None:
                return function(*args, **kwargs)
            with output_lock(folder, command):
                return function(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate
