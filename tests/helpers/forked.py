"""Run a function in a forked copy of the test process, for kills, full disks, other users and concurrent
writers: the child starts with every import loaded (no fresh interpreter to wait for) and behaves like a
command-line run (its stdout/stderr go to pipes the parent reads, logging has no handler, as in a fresh
process).

``start(fn, *args)`` returns a :class:`Forked` to ``wait()`` on or ``kill()``; ``run(fn, *args)`` waits.
``fsize`` caps the size of any file the child writes (``RLIMIT_FSIZE``, with ``SIGXFSZ`` ignored, so a
write beyond it fails with ``EFBIG`` like one on a full disk); ``user`` runs the child as another uid.

A child running as another user reads no file that user cannot reach, and where the repository (with its
``.venv``) lies in a folder only its owner can enter (a root user's home, a 0700 ``mktemp -d``) that includes
the modules the test process has not imported yet: ``preload`` names those the child imports on its way
(lazily, inside a function), imported before it changes user.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import resource
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class _Reader(threading.Thread):
    """Drains a pipe into a buffer (pipes, not files: a file-size limit in the child must not hit them)."""

    def __init__(self, fd: int) -> None:
        super().__init__(daemon=True)
        self.fd, self.chunks = fd, []
        self.start()

    def run(self) -> None:
        while chunk := os.read(self.fd, 65536):
            self.chunks.append(chunk)
        os.close(self.fd)

    def text(self) -> str:
        return b"".join(self.chunks).decode(errors="replace")


@dataclass
class Forked:
    pid: int
    readers: tuple = field(repr=False)
    returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
                for reader in self.readers:
                    reader.join(5)
        return self.returncode

    def wait(self, timeout: float = 300) -> int:
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                self.kill()
                self.wait(10)
                raise TimeoutError(f"forked child {self.pid} still running after {timeout} s:\n{self.err}")
            time.sleep(0.02)
        return self.returncode  # type: ignore[return-value]

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    @property
    def out(self) -> str:
        return self.readers[0].text()

    @property
    def err(self) -> str:
        return self.readers[1].text()


def start(
    fn: Callable[..., Any],
    *args: Any,
    fsize: int | None = None,
    user: int | None = None,
    preload: tuple[str, ...] = (),
    **kwargs: Any,
) -> Forked:
    """Fork; the child runs ``fn(*args, **kwargs)`` and exits with its return value (0 for None, 1 after an
    uncaught exception, whose traceback goes to its stderr)."""
    (out_read, out_write), (err_read, err_write) = os.pipe(), os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        os.close(out_write)
        os.close(err_write)
        return Forked(pid, (_Reader(out_read), _Reader(err_read)))
    code = 1
    try:
        os.close(out_read)
        os.close(err_read)
        os.dup2(out_write, 1)
        os.dup2(err_write, 2)
        sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
        sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
        logging.getLogger().handlers.clear()  # pytest's capture handlers: a fresh process has none
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _one_thread_after_fork()
        for module in preload:
            importlib.import_module(module)
        if user is not None:
            os.setgid(user)
            os.setuid(user)
        if fsize is not None:
            limit_file_size(fsize)
        result = fn(*args, **kwargs)
        code = int(result or 0)
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _one_thread_after_fork() -> None:
    """A forked child must not enter OpenMP: libgomp's thread pool does not survive ``fork`` (the parent's
    workers are gone, so the child's first parallel region waits for them forever). With one thread, torch
    runs its kernels inline."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


def run(fn: Callable[..., Any], *args: Any, timeout: float = 300, **kwargs: Any) -> Forked:
    child = start(fn, *args, **kwargs)
    child.wait(timeout)
    return child


def limit_file_size(size: int) -> None:
    """From now on in this process, writing a file beyond ``size`` bytes fails with ``EFBIG`` (a full disk)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))


def wait_for(condition: Callable[[], bool], timeout: float = 120, child: Forked | None = None) -> None:
    """Poll ``condition`` until it holds; fails early if ``child`` exits first."""
    deadline = time.monotonic() + timeout
    while not condition():
        if child is not None and child.poll() is not None:
            raise AssertionError(f"child exited ({child.returncode}) first:\n{child.err[-3000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.02)
