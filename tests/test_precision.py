"""bf16 or float32 chosen by the machine: the decision for every kind of CPU (capability strings and flag
sets given as arguments), the variables that hold a process to AVX2 (set here, so the tests hold on any
CPU), the demo's presets under it, RunConfig's unset bf16, and the warning an explicit bf16 gets where the
CPU emulates it."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from peft_grounded.pipeline import PRESETS
from peft_grounded.pipeline.demo import machine_precision
from peft_grounded.precision import (
    bf16_slowdown,
    choose_cpu_precision,
    choose_precision,
    cpu_capability,
    cpu_flags,
    cpu_has_native_bf16,
    emulation_warning,
    isa_limits,
    script_precision,
)

EPYC_AVX2 = ("AVX2", frozenset({"fpu", "sse4_2", "avx", "avx2", "fma"}))
SAPPHIRE_RAPIDS = ("AVX512", frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}))
SKYLAKE_X = ("AVX512", frozenset({"avx2", "avx512f", "avx512bw"}))  # AVX-512 without its bf16 extension
GRAVITON3 = ("SVE256", frozenset({"fp", "asimd", "sve", "bf16", "i8mm"}))


@pytest.mark.parametrize(
    "capability, flags, native",
    [
        (*EPYC_AVX2, False),
        (*SAPPHIRE_RAPIDS, True),
        (*SKYLAKE_X, False),
        (*GRAVITON3, True),
        ("AVX512", None, True),  # flags unknown (no /proc/cpuinfo): torch's capability decides
        ("AVX2", None, False),
        ("DEFAULT", None, False),
        ("NO AVX", None, False),
    ],
    ids=[
        "avx2",
        "avx512_bf16_amx",
        "avx512_without_bf16",
        "arm_bf16",
        "avx512_no_flags",
        "avx2_no_flags",
        "default",
        "no_avx",
    ],
)
def test_native_bf16_by_capability_and_flags(capability, flags, native):
    assert cpu_has_native_bf16(capability, flags) is native
    choice = choose_cpu_precision(capability, flags)
    assert choice.bf16 is native and capability in choice.reason
    assert choice.weights_dtype == ("bfloat16" if native else "float32")
    assert ("emulates bf16" in choice.reason) is (not native)


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512f avx512_bf16\n\n")
    assert cpu_flags(x86) == {"fpu", "avx2", "avx512f", "avx512_bf16"}
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd sve bf16\nCPU implementer\t: 0x41\n")
    assert "bf16" in cpu_flags(arm)
    assert cpu_flags(tmp_path / "missing") is None


AVX2_ENVIRONMENT = {  # what the suite runs under to play an AVX2 CPU on any machine
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
}


def as_avx2(monkeypatch) -> None:
    for name, value in AVX2_ENVIRONMENT.items():
        monkeypatch.setenv(name, value)


@pytest.mark.parametrize(
    "environ, native",
    [
        ({}, True),
        ({"ATEN_CPU_CAPABILITY": "avx2"}, False),
        ({"ATEN_CPU_CAPABILITY": "default"}, False),
        ({"ATEN_CPU_CAPABILITY": "avx512"}, True),  # a variable lowers, never raises
        ({"ONEDNN_MAX_CPU_ISA": "AVX2"}, False),
        ({"ONEDNN_MAX_CPU_ISA": "avx512_core"}, False),  # AVX-512 without its bf16 extension
        ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}, True),
        ({"ONEDNN_MAX_CPU_ISA": "ALL"}, True),
        ({"MKL_ENABLE_INSTRUCTIONS": "AVX2"}, False),
        ({"MKL_ENABLE_INSTRUCTIONS": ""}, True),
        (AVX2_ENVIRONMENT, False),
    ],
)
def test_the_environment_holds_a_bf16_cpu_to_float32(environ, native):
    choice = choose_cpu_precision(*SAPPHIRE_RAPIDS, environ)
    assert choice.bf16 is native
    if not native:  # the reason names every variable that decided it
        assert all(f"{name}={value}" in choice.reason for name, value in environ.items())
    assert choose_cpu_precision(*EPYC_AVX2, environ).bf16 is False  # and never turns bf16 on


def test_this_machines_choice_follows_the_environment(monkeypatch):
    for name in AVX2_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    assert isa_limits() == []
    assert choose_precision("cpu").bf16 is cpu_has_native_bf16(cpu_capability(), cpu_flags())
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx2")
    assert isa_limits() == ["ONEDNN_MAX_CPU_ISA=avx2"]
    choice = choose_precision("cpu")
    assert choice.bf16 is False and "ONEDNN_MAX_CPU_ISA=avx2" in choice.reason
    as_avx2(monkeypatch)
    assert len(isa_limits()) == 3 and choose_precision("cpu").bf16 is False
    message = emulation_warning("bf16 (--bf16)", choose_precision("cpu"), 20.0)
    assert "ATEN_CPU_CAPABILITY=avx2" in message


def test_this_machine_follows_the_same_decision():
    choice = choose_precision("cpu")
    assert choice == choose_cpu_precision(cpu_capability(), cpu_flags(), os.environ)
    ratio = bf16_slowdown()
    assert math.isfinite(ratio) and ratio > 0


def test_timing_the_emulation_leaves_the_random_generator_alone():
    """The slowdown is timed inside a run (its warning); a run seeded before it must draw what it would have."""
    import torch

    bf16_slowdown.cache_clear()
    torch.manual_seed(0)
    bf16_slowdown(size=16, repeats=1)
    drawn = torch.rand(3)
    torch.manual_seed(0)
    torch.testing.assert_close(drawn, torch.rand(3))


def test_the_demo_runs_float32_where_bf16_is_emulated():
    default = PRESETS["default"]
    # the preset asks for bf16 where it is native; its stages are built without it until the choice is made
    assert default.bf16 and not default.budget.bf16 and default.budget.weights_dtype == "bfloat16"
    spec, why = machine_precision(default, choice=choose_cpu_precision(*EPYC_AVX2))
    assert not spec.budget.bf16 and spec.budget.weights_dtype == "float32"
    assert "emulates bf16" in why and "AVX2" in why
    assert spec.budget == replace(default.budget, weights_dtype="float32")  # nothing else changed
    spec, why = machine_precision(default, choice=choose_cpu_precision(*SAPPHIRE_RAPIDS))
    assert spec.budget.bf16 and spec.budget.weights_dtype == "bfloat16" and "native bf16" in why
    assert spec.budget.evaluation.bf16 and spec.budget == default.budget.with_precision(True)
    full = machine_precision(PRESETS["full"], choice=choose_cpu_precision(*SAPPHIRE_RAPIDS))[0].budget
    assert full.bf16 and full.weights_dtype == "float32"  # the GPU preset's frozen base stays float32
    smoke = PRESETS["smoke"]  # a float32 preset stays float32 on any machine
    assert machine_precision(smoke, choice=choose_cpu_precision(*SAPPHIRE_RAPIDS))[0] is smoke
    assert machine_precision(default, "fp32")[0].budget.bf16 is False
    forced = machine_precision(smoke, "bf16", device="cuda")[0].budget  # forced, whatever the machine
    assert forced.bf16 and forced.weights_dtype == "bfloat16"


def test_building_the_presets_on_an_emulating_cpu_does_not_warn():
    """The demo's first lines on an AVX2 CPU must not warn about a bf16 that the demo then turns off."""
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    code = (
        "import warnings; warnings.simplefilter('error', UserWarning)\n"
        "from peft_grounded.precision import choose_precision\n"
        "assert not choose_precision('cpu').bf16\n"
        "from peft_grounded.pipeline.demo import PRESETS, machine_precision\n"
        "assert not machine_precision(PRESETS['default'])[0].budget.bf16\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_an_explicit_bf16_on_an_emulating_cpu_warns_with_the_measured_ratio():
    message = emulation_warning("bf16 (--bf16)", choose_cpu_precision(*EPYC_AVX2), 20.0)
    assert "bf16 (--bf16) on a CPU without native bf16" in message and "AVX2" in message
    assert "20.0x the time of a float32 one" in message and "leave bf16 off" in message
    assert emulation_warning("bf16", choose_cpu_precision(*SAPPHIRE_RAPIDS), 0.3) is None


def test_run_config_leaves_an_unset_bf16_to_the_machine(tmp_path, monkeypatch):
    from peft_grounded.training.stage_config import GroundingConfig

    unset = GroundingConfig(output_dir=str(tmp_path), max_steps=1, use_cpu=True)
    assert unset.bf16 is choose_precision("cpu").bf16  # TRL alone would turn bf16 on everywhere
    as_avx2(monkeypatch)
    assert GroundingConfig(output_dir=str(tmp_path), max_steps=1, use_cpu=True).bf16 is False
    assert GroundingConfig(output_dir=str(tmp_path), max_steps=1, use_cpu=True, bf16=False).bf16 is False


def test_a_script_cannot_ask_for_both_precisions(capsys):
    with pytest.raises(ValueError, match="--fp32 and --bf16 contradict"):
        script_precision(fp32=True, bf16=True)
    assert script_precision(fp32=True).bf16 is False
    assert "precision: float32 (--fp32)" in capsys.readouterr().out
