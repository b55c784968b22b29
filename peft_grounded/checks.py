"""A user's mistakes in one sentence: range checks for settings, and what an exception a user can fix says.

Range checks for settings, run by the settings dataclasses and entry points before any work starts.

Each check returns ``None`` or one sentence naming the field (and its command-line flag), the value given
and what is allowed; :func:`raise_problems` raises one :class:`SettingsError` listing every problem, so a
user fixes them all at once. Booleans are not numbers here, and NaN or infinity is never in range.

:func:`describe` turns the exceptions a user can fix (bad input, files, the Hub, a missing extra) into the
one line the command line prints as ``error: ...`` (and the serving layer wraps Hub failures with);
:func:`listed` keeps a message readable whatever the input's size. Both are below the checks.
"""

from __future__ import annotations

import errno
import json
import math
import numbers
from collections.abc import Iterable, Sequence
from typing import Any

SEED_MAX = 2**32 - 1  # numpy's (and so transformers' set_seed) largest seed


class SettingsError(ValueError):
    """Settings out of range; the message names each field, its value and the allowed range."""


def _problem(name: str, allowed: str, value: Any, flag: str | None) -> str:
    return f"{name} must be {allowed}, got {value!r}" + (f" ({flag})" if flag else "")


def is_int(value: Any) -> bool:
    """An integer, not a bool (numpy integers count)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A finite real number, not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def int_at_least(
    name: str, value: Any, low: int, *, flag: str | None = None, none_ok: bool = False
) -> str | None:
    """``value`` is an integer ``>= low`` (or None when ``none_ok``)."""
    if value is None and none_ok:
        return None
    if is_int(value) and value >= low:
        return None
    allowed = ("a positive integer" if low == 1 else f"an integer >= {low}") + (" or None" if none_ok else "")
    return _problem(name, allowed, value, flag)


def number_in(
    name: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
    flag: str | None = None,
    none_ok: bool = False,
) -> str | None:
    """``value`` is a finite number in the interval (``low_open``/``high_open``: bound excluded)."""
    if value is None and none_ok:
        return None
    inside = is_number(value)
    if inside and low is not None:
        inside = value > low if low_open else value >= low
    if inside and high is not None:
        inside = value < high if high_open else value <= high
    if inside:
        return None
    bounds = []
    if low is not None:
        bounds.append(f"{'>' if low_open else '>='} {low:g}")
    if high is not None:
        bounds.append(f"{'<' if high_open else '<='} {high:g}")
    if (low, high, low_open, high_open) == (0, 1, False, False):
        allowed = "a fraction between 0 and 1"
    else:
        allowed = "a finite number" + (" " + " and ".join(bounds) if bounds else "")
    return _problem(name, allowed + (" or None" if none_ok else ""), value, flag)


def seed(name: str, value: Any, *, flag: str | None = None) -> str | None:
    """A seed numpy accepts: an integer in ``[0, 2**32 - 1]``."""
    if is_int(value) and 0 <= value <= SEED_MAX:
        return None
    return _problem(name, f"an integer between 0 and {SEED_MAX}", value, flag)


def one_of(name: str, value: Any, choices: Iterable[Any], *, flag: str | None = None) -> str | None:
    options = list(choices)
    if value in options:
        return None
    return _problem(name, "one of " + ", ".join(map(repr, options)), value, flag)


def raise_problems(owner: str, problems: Iterable[str | None], hint: str = "") -> None:
    """Raise one :class:`SettingsError` listing every problem (``None`` entries are fine); a no-op if none."""
    found = [p for p in problems if p]
    if found:
        raise SettingsError(f"{owner}: " + "; ".join(found) + (f". {hint}" if hint else "."))


def check_device(device: Any, flag: str = "--device") -> str:
    """``device`` as a string, refused clearly when torch cannot use it here (no CUDA build, no GPU)."""
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise SettingsError(
            f"{flag} {device!r} is not a torch device; use cpu, cuda, cuda:N or mps"
        ) from None
    if parsed.type == "cuda":
        if not torch.backends.cuda.is_built():
            raise SettingsError(
                f"{flag} {device}: this torch ({torch.__version__}) was built without CUDA; use {flag} cpu, "
                "or install a CUDA build of torch"
            )
        count = torch.cuda.device_count()
        if count == 0:
            raise SettingsError(f"{flag} {device}: no CUDA GPU is visible; use {flag} cpu")
        if parsed.index is not None and parsed.index >= count:
            raise SettingsError(
                f"{flag} {device}: only {count} CUDA GPU(s) are visible (cuda:0..cuda:{count - 1})"
            )
    elif parsed.type == "mps" and not torch.backends.mps.is_available():
        raise SettingsError(f"{flag} {device}: Apple's MPS backend is not available here; use {flag} cpu")
    elif parsed.type not in ("cpu", "cuda", "mps"):
        raise SettingsError(f"{flag} {device}: peft_grounded runs on cpu, cuda or mps")
    return str(device)


# One sentence for an exception a user can fix (the command line prints it as ``error: ...``, the serving
# layer wraps Hub failures with it), never a traceback.
#
# :func:`describe` turns bad input (``ValueError``), files (``OSError``: missing, a folder where a file is
# expected, no permission, a full disk), the Hub client (HTTP refusals, no network, offline mode: the
# ``huggingface_hub`` errors and the ``httpx``/``requests`` transport errors it lets through), safetensors
# and JSON errors, and a missing extra (``pip install 'peft-grounded[sids]'``), into a sentence that names
# the problem and the fix; anything else is a bug and keeps its
# traceback. Only the class names and modules are looked at, so nothing heavy is imported here.

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


# Helpers for error messages that stay readable whatever the input's size.


def listed(names: Sequence[Any], most: int = 10) -> str:
    """``names`` for a message: the first ``most``, then how many more (a file can have thousands)."""
    shown = ", ".join(repr(n) for n in list(names)[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")
