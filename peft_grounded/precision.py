"""bf16 or float32: the precision this machine runs faster, chosen once, with the reason.

bf16 autocast and bf16 weights halve the memory traffic, and a CPU with native bf16 instructions (x86:
AVX512-BF16 or AMX; Arm: the BF16 extension) or a GPU that supports it runs them faster than float32. A CPU
without them *emulates* bf16, many times slower than float32 (BENCHMARKS.md). :func:`choose_precision` decides
from the CPU's flags (``/proc/cpuinfo``) and torch's CPU capability (``AVX512``, ``AVX2``, ``DEFAULT``, ...);
:func:`bf16_slowdown` times a small bf16 and float32 matmul once (cached) for the messages. The decision
itself, :func:`cpu_has_native_bf16`, takes the capability and flags as arguments, so it is tested for every
kind of CPU on any machine.

:func:`one_thread` runs small CPU tensor work on one thread: with several, thread wake-ups dominate small ops
(and on a loaded machine make them many times slower).
"""

from __future__ import annotations

import functools
import logging
import os
import time
import warnings
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")  # x86 (flags), x86 AMX, Arm (Features)
_NATIVE_CAPABILITIES = (
    "AVX512",
    "AMX",
)  # torch's capability names that come with bf16 when no flags are known


# Values of each variable that hold a process below native bf16 (upper case; anything else, e.g. ``avx512``,
# ``AVX512_CORE_BF16`` or ``ALL``, leaves the CPU's own flags to decide: a variable can lower, never raise).
ISA_VARIABLES: dict[str, frozenset[str]] = {
    # torch's CPU kernels (read by torch at import; read here each time)
    "ATEN_CPU_CAPABILITY": frozenset({"DEFAULT", "NO_AVX", "AVX", "AVX2", "ZVECTOR", "VSX"}),
    # oneDNN's ISAs below AVX512_CORE_BF16
    "ONEDNN_MAX_CPU_ISA": frozenset(
        {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI"}
    ),
    # MKL's code paths without bf16 (AVX512_E1 is VNNI)
    "MKL_ENABLE_INSTRUCTIONS": frozenset({"SSE4_2", "AVX", "AVX2", "AVX2_E1", "AVX512", "AVX512_E1"}),
}


def isa_limits(environ: Mapping[str, str] | None = None) -> list[str]:
    """The variables of ``environ`` (default ``os.environ``) that hold the process below native bf16, as
    ``NAME=value`` (see :data:`ISA_VARIABLES`); empty when none does."""
    environ = os.environ if environ is None else environ
    found = []
    for name, below in ISA_VARIABLES.items():
        value = environ.get(name, "").strip()
        if value and value.upper().replace("-", "_").replace(" ", "_") in below:
            found.append(f"{name}={value}")
    return found


@dataclass(frozen=True)
class PrecisionChoice:
    """Whether to run bf16 (autocast and weights), and why."""

    bf16: bool
    reason: str

    @property
    def weights_dtype(self) -> str:
        return "bfloat16" if self.bf16 else "float32"

    @property
    def name(self) -> str:
        return "bf16" if self.bf16 else "float32"


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str] | None:
    """The CPU's feature flags (x86 ``flags``, Arm ``Features``), or None where the file does not exist."""
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("flags", "features"):
            return frozenset(value.split())
    return None


def cpu_capability() -> str:
    """torch's name for the vector instructions its CPU kernels use (``AVX512``, ``AVX2``, ``DEFAULT``, ...)."""
    import torch

    return torch.backends.cpu.get_cpu_capability()


def cpu_has_native_bf16(capability: str, flags: Collection[str] | None) -> bool:
    """Whether a CPU runs bf16 natively: by its flags when known (``avx512_bf16``, ``amx_bf16`` or Arm's
    ``bf16``), else by torch's ``capability`` (``AVX512`` and ``AMX`` variants: yes; ``AVX2``, ``DEFAULT``,
    ``NO AVX``, ...: no)."""
    if flags is not None:
        return any(flag in flags for flag in NATIVE_BF16_FLAGS)
    return capability.upper().startswith(_NATIVE_CAPABILITIES)


def choose_cpu_precision(
    capability: str, flags: Collection[str] | None, environ: Mapping[str, str] | None = None
) -> PrecisionChoice:
    """bf16 on a CPU with native bf16, float32 where it is emulated or where a variable of ``environ``
    (default: none; :func:`choose_precision` passes ``os.environ``) holds the process below it; the reason
    names what decided it."""
    limits = isa_limits(environ or {})
    if limits:
        return PrecisionChoice(
            False,
            f"float32: the environment holds the CPU below native bf16 ({', '.join(limits)}; CPU capability "
            f"{capability}), so bf16 would be emulated, which is many times slower than float32",
        )
    found = sorted(set(flags or ()) & set(NATIVE_BF16_FLAGS))
    if flags is not None:
        evidence = f"CPU capability {capability}, " + (
            f"flag {', '.join(found)}" if found else "no avx512_bf16/amx_bf16/bf16 flag"
        )
    else:
        evidence = f"CPU capability {capability}, CPU flags unknown"
    if cpu_has_native_bf16(capability, flags):
        return PrecisionChoice(True, f"bf16: the CPU has native bf16 ({evidence})")
    return PrecisionChoice(
        False, f"float32: the CPU emulates bf16 ({evidence}), which is many times slower than float32"
    )


def choose_precision(device: str = "cpu") -> PrecisionChoice:
    """The precision for ``device`` on this machine: a GPU's bf16 support, or the CPU's under the current
    environment's limits (:func:`isa_limits`; cached per device and limits)."""
    return _choose_precision(device, tuple(isa_limits()))


@functools.cache
def _choose_precision(device: str, limits: tuple[str, ...]) -> PrecisionChoice:
    import torch

    if device.startswith("cuda"):
        if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return PrecisionChoice(True, "bf16: the GPU supports it")
        return PrecisionChoice(False, "float32: the GPU does not support bf16")
    return choose_cpu_precision(cpu_capability(), cpu_flags(), dict(v.split("=", 1) for v in limits))


@functools.cache
def bf16_slowdown(size: int = 256, repeats: int = 5) -> float:
    """How many times slower a ``size``-square bf16 matmul runs than a float32 one on this CPU (best of
    ``repeats``; measured once per process, leaving the global random generator untouched)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(size, size, generator=generator), torch.randn(size, size, generator=generator)
    times = {}
    for dtype in (torch.float32, torch.bfloat16):
        x, y = a.to(dtype), b.to(dtype)
        torch.mm(x, y)  # warm-up
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            torch.mm(x, y)
            best = min(best, time.perf_counter() - start)
        times[dtype] = max(best, 1e-9)
    return times[torch.bfloat16] / times[torch.float32]


def resolve_bf16(requested: bool | None, device: str = "cpu", what: str = "bf16") -> bool:
    """``requested`` when given (True on a CPU that emulates bf16 warns, with the measured slowdown), else
    this machine's choice for ``device`` (logged with its reason)."""
    if requested is None:
        choice = choose_precision(device)
        logger.info("precision chosen by the machine: %s", choice.reason)
        return choice.bf16
    if requested:
        warn_if_emulated(what, device)
    return bool(requested)


def emulation_warning(what: str, choice: PrecisionChoice, slowdown: float) -> str | None:
    """The warning for ``what`` (an explicit bf16) under the CPU's ``choice``; None where bf16 is native."""
    if choice.bf16:
        return None
    evidence = choice.reason.split(": ", 1)[-1]
    return (
        f"{what} on a CPU without native bf16 ({evidence}): a bf16 matmul measured {slowdown:.1f}x the time of a "
        "float32 one here, so training and decoding will be much slower; leave bf16 off (float32) on this machine"
    )


@functools.cache
def warn_if_emulated(what: str = "bf16", device: str = "cpu") -> None:
    """Warn (once per ``what``) when bf16 is asked for on a CPU that emulates it."""
    if device != "cpu":
        return
    choice = choose_precision("cpu")
    message = None if choice.bf16 else emulation_warning(what, choice, bf16_slowdown())
    if message:
        warnings.warn(message, stacklevel=3)


def script_precision(fp32: bool = False, bf16: bool = False, device: str | None = None) -> PrecisionChoice:
    """A script's precision (the benchmarks' ``--fp32`` / ``--bf16``): forced by either flag, else this
    machine's choice; printed with its reason, so a recorded figure says which precision it ran."""
    if fp32 and bf16:
        raise ValueError(
            "--fp32 and --bf16 contradict each other; give one (or neither: the machine chooses)"
        )
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    if fp32:
        choice = PrecisionChoice(False, "float32 (--fp32)")
    elif bf16:
        warn_if_emulated("bf16 (--bf16)", device)
        choice = PrecisionChoice(True, "bf16 (--bf16)")
    else:
        choice = choose_precision(device)
    print(f"precision: {choice.reason}", flush=True)
    return choice


# Run small CPU tensor work on one thread: with several, thread wake-ups dominate small ops (and on a
# loaded machine make them many times slower).


@contextmanager
def one_thread(device: torch.device | str | None = None) -> Iterator[None]:
    """Within the block, torch uses one CPU thread (a no-op for other devices)."""
    if device is not None and torch.device(device).type != "cpu":
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
