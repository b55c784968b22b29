"""One sentence for an exception a user can fix (the command line prints it as ``error: ...``, the serving
layer wraps Hub failures with it), never a traceback.

:func:`describe` turns bad input (``ValueError``), files (``OSError``: missing, a folder where a file is
expected, no permission, a full disk), the Hub client (HTTP refusals, no network, offline mode: the
``huggingface_hub`` errors and the ``httpx``/``requests`` transport errors it lets through), safetensors
and JSON errors, and a missing extra (``pip install 'peft-grounded[sids]'``), into a sentence that names
the problem and the fix; anything else is a bug and keeps its
traceback. Only the class names and modules are looked at, so nothing heavy is imported here.
"""

from __future__ import annotations

import errno
import json

EXIT_USAGE = 2  # bad input, as argparse
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C

_NETWORK_MODULES = ("httpx", "httpx2", "httpcore", "requests", "urllib3", "h11", "ssl")


def _modules(err: BaseException) -> list[str]:
    return [cls.__module__.split(".")[0] for cls in type(err).__mro__]


def _names(err: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(err).__mro__}


def _hub_endpoint() -> str:
    try:
        from huggingface_hub import constants

        return constants.ENDPOINT
    except ImportError:  # pragma: no cover - always installed with transformers
        return "the Hub"


def _describe_os_error(err: OSError) -> str:
    name = err.filename
    if name is None or err.strerror is None:  # raised with a message of ours
        return str(err)
    if err.filename2 is not None:
        name = f"{name} -> {err.filename2}"
    if isinstance(err, FileNotFoundError):
        return f"{name}: no such file or directory; check the path"
    if isinstance(err, IsADirectoryError):
        return f"{name} is a directory, where a file was expected; give the file's path"
    if isinstance(err, NotADirectoryError):
        return f"{name}: a file stands where a directory is expected; give a directory's path"
    if isinstance(err, PermissionError):
        return (
            f"{name}: permission denied; make it readable (or writable) for this user, or choose another path"
        )
    if err.errno == errno.ENOSPC:
        return (
            f"no space left on the device while writing {name}; free some space and run the command again "
            "(files are written through temporary files, so the previous versions are intact)"
        )
    return f"{name}: {err.strerror}"


def describe(err: BaseException) -> str | None:
    """The one-line message for ``err``, or ``None`` when it is not a user's error (a bug: re-raise it)."""
    modules, names = _modules(err), _names(err)
    if "MissingExtraError" in names:  # an extra not installed: the message names the pip command
        return str(err)
    if "OfflineModeIsEnabled" in names:
        return (
            f"{str(err).rstrip('.')}. HF_HUB_OFFLINE=1 is set, so the Hub is not contacted: unset it (or set it to 0) to push "
            "or pull, or load from a local folder"
        )
    if "HfHubHTTPError" in names:
        return f"the Hub refused the request: {err}"
    if any(m in _NETWORK_MODULES for m in modules) or "ConnectionError" in names:
        return (
            f"cannot reach the Hub at {_hub_endpoint()} ({type(err).__name__}: {err}); check the network "
            "connection, a proxy, or HF_ENDPOINT, and try again"
        )
    if "huggingface_hub" in modules:
        return f"the Hub client failed ({type(err).__name__}: {err})"
    if "safetensors" in modules:
        return f"a safetensors file cannot be read ({err}): truncated or corrupted; save or download it again"
    if isinstance(err, json.JSONDecodeError):
        return f"not valid JSON ({err}); fix the file or restore a good copy"
    if isinstance(err, UnicodeDecodeError):
        return f"a file is not UTF-8 text ({err}); save it as UTF-8"
    if isinstance(err, OSError):
        return _describe_os_error(err)
    if isinstance(err, ValueError):
        return str(err)
    return None
