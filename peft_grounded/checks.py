"""Range checks for settings, run by the settings dataclasses and entry points before any work starts.

Each check returns ``None`` or one sentence naming the field (and its command-line flag), the value given
and what is allowed; :func:`raise_problems` raises one :class:`SettingsError` listing every problem, so a
user fixes them all at once. Booleans are not numbers here, and NaN or infinity is never in range.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
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
