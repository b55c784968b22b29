"""Files, for every module: atomic writes, what a command owns in a folder it writes, one writer per folder.

Atomic writes: a temporary file in the target's folder, flushed, then ``os.replace``.
Readers see the old file or the whole new one, never a part. The file gets the permissions an ordinary
``open(path, "w")`` would give (``0o666`` minus the umask), not the ``0o600`` of ``mkstemp``; folders
filled beside their target (:func:`make_temp_dir`) those of ``mkdir``, not the ``0o700`` of ``mkdtemp``.

Below them: the files a command owns in a folder (:func:`replace_keeping_others`, :func:`check_report_folder`)
and the output lock (:func:`output_lock`, :func:`locks_output`), each introduced where it starts.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import inspect
import json
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

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


# What a command owns in a folder it writes: it replaces its own files and nothing else.
#
# A folder a command did not create may hold the user's files (notes, a README, data); a command writes
# or replaces only the files it owns there. Model cards are recognised by their front matter: TRL's carry
# the ``generated_from_trainer`` tag, PEFT's ``library_name: peft``; a ``README.md`` without them is the
# user's.

TRL_CARD_MARKER = "generated_from_trainer"  # a tag of every card TRL's trainers write
PEFT_CARD_MARKER = "library_name: peft"  # PEFT's save_pretrained card


def front_matter(path: Path, limit: int = 8192) -> str:
    """The YAML front matter (between the leading ``---`` lines) of a markdown file, or ''."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(limit)
    except OSError:
        return ""
    if not text.startswith("---"):
        return ""
    end = text.find("\n---", 3)
    return text[3:end] if end > 0 else ""


def is_generated_card(path: Path, marker: str) -> bool:
    """Whether the markdown file ``path`` is a model card a library generated (``marker`` in its front matter)."""
    return marker in front_matter(path)


RUN_MANIFEST = "run.json"  # a training run's (or a strategy run's) folder: see peft_grounded.training.runs


def check_report_folder(
    folder: Path,
    tool: str,
    files: Sequence[str],
    recognise: Callable[[Any], bool],
    flag: str = "--output_dir",
) -> None:
    """Refuse to write ``tool``'s ``files`` into ``folder`` unless it is new, or holds only other files, or
    holds ``tool``'s own earlier output (its ``files[0]``, a JSON file, passes ``recognise``).

    A training run's folder (``run.json``) is always refused: its ``metrics.json`` and curves are the
    run's record, and a strategy run refuses to resume once another tool replaced them."""
    if not folder.exists():
        return
    if not folder.is_dir():
        raise ValueError(f"{flag} {folder} is a file, not a folder; choose another {flag}")
    fix = f"choose another {flag} (e.g. a new folder inside it); nothing was written"
    if (folder / RUN_MANIFEST).is_file():
        raise ValueError(
            f"{folder} is a training run's folder (it holds {RUN_MANIFEST}): {tool} would replace the run's "
            f"own {', '.join(n for n in files if (folder / n).exists()) or 'files'}; {fix}"
        )
    first = folder / files[0]
    if first.exists():
        try:
            ours = recognise(json.loads(first.read_text(encoding="utf-8")))
        except (json.JSONDecodeError, UnicodeDecodeError, OSError):
            ours = False
        if not ours:
            raise ValueError(f"{first} was not written by {tool}, which would replace it; {fix}")
        return
    clashing = [name for name in files[1:] if (folder / name).exists()]
    if clashing:
        raise ValueError(
            f"{folder} holds {', '.join(clashing)}, not written by {tool} (no {files[0]} of its own next to "
            f"them), which it would replace; {fix}"
        )


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)  # same filesystem: no data copied, the user's file stays the same inode
    except OSError:
        shutil.copy2(source, target)


def _carry(entry: Path, target: Path) -> None:
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.is_dir():
        shutil.rmtree(target)
    if entry.is_symlink():
        os.symlink(os.readlink(entry), target)
    elif entry.is_dir():
        shutil.copytree(entry, target, symlinks=True, copy_function=_link_or_copy)
    else:
        _link_or_copy(str(entry), str(target))


def replace_keeping_others(new: Path, folder: Path, owned: Callable[[Path], bool]) -> list[str]:
    """Put the finished folder ``new`` in place of ``folder`` in one rename, carrying over every entry of
    ``folder`` that ``owned`` does not claim (hard links, else copies; the user's version wins over a file
    of the same name in ``new``). Returns the names carried over."""
    kept = []
    if folder.is_dir():
        for entry in sorted(folder.iterdir()):
            if not owned(entry):
                _carry(entry, new / entry.name)
                kept.append(entry.name)
    swap_dir_into_place(new, folder)
    return kept


# One writer per output folder: a lock file with the owner's pid, held with ``fcntl.flock``.
#
# Every command that writes a folder (build-sids, add-items, ground, sft, grow-adapter, evaluate, diagnose,
# demo) holds :func:`output_lock` on it from its first check to its last write, so a second process aimed
# at the same folder stops at once with :class:`OutputBusyError`, naming the folder and the holder's pid,
# instead of both finishing and one silently replacing the other's files.
#
# The lock file sits beside the folder (``<parent>/.<name>.peft_grounded.lock``), so the folder itself holds
# only what the command writes and a refused command creates nothing; when the parent is not writable (an
# output folder directly in a read-only place) it sits inside the folder. The kernel drops a ``flock`` when
# its process dies: a lock file left by a killed run is taken over, with a message naming the dead pid.
# Locks are re-entrant within a process (a demo holds its folder while its stages lock their sub-folders)
# and taken by the main process of a distributed launch only (the other ranks write under its lock).

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
