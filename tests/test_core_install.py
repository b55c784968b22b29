"""The core install and its extras (docs/layout.md): the library's modules import neither the harness nor an
extra's package at module level; a missing extra stops with the ``pip install`` line that brings it; the
adapter's whole cycle runs with the extras hidden, and in a fresh virtual environment holding the core alone."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from peft_grounded._imports import EXTRA_OF, MissingExtraError, require

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "peft_grounded"
SCRIPT = Path(__file__).resolve().parent / "helpers" / "core_only.py"
HARNESS = ("pipeline", "diagnostics")  # the research harness inside the package (docs/layout.md)


def _module_level_imports(path: Path) -> list[str]:
    """Absolute names of what ``path`` imports at module level (not inside functions or TYPE_CHECKING)."""
    tree = ast.parse(path.read_text())
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    names = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                names.append(".".join([*base, *([node.module] if node.module else [])]))
            else:
                names.append(node.module or "")
    return names


def test_library_modules_import_no_harness_and_no_extra_at_module_level():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).parts
        in_harness = parts[0] in HARNESS or parts[0] == "cli"  # the CLI loads each command when it runs
        for name in _module_level_imports(path):
            top = name.split(".")[0]
            harness = name.startswith(tuple(f"peft_grounded.{h}" for h in HARNESS))
            if not in_harness and (harness or top in EXTRA_OF):
                offenders.append(f"{path.relative_to(ROOT)}: {name}")
            elif in_harness and top in EXTRA_OF and parts[-1] != "plots.py":
                offenders.append(f"{path.relative_to(ROOT)}: {name} (import it through _imports.require)")
    assert not offenders, offenders


def test_a_missing_extra_names_the_pip_line(monkeypatch):
    import peft_grounded.diagnostics  # the package and transformers load before anything hides
    from peft_grounded.checks import describe
    from peft_grounded.sids.encoders import SentenceTransformerEncoder

    monkeypatch.setitem(sys.modules, "sentence_transformers", None)  # as if not installed
    with pytest.raises(MissingExtraError, match=r"pip install 'peft-grounded\[sids\]'") as caught:
        SentenceTransformerEncoder()
    assert "sentence-transformers" in str(caught.value) and "build-sids" in str(caught.value)
    assert describe(caught.value) == str(caught.value)  # the CLI prints it as one error line
    assert isinstance(caught.value, ImportError)  # code that catches ImportError still does

    monkeypatch.setitem(sys.modules, "scipy.optimize", None)
    with pytest.raises(MissingExtraError, match=r"peft-grounded\[sids\]"):
        require("scipy.optimize", "dedup='reassign'")

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.delitem(sys.modules, "peft_grounded.diagnostics.plots", raising=False)
    with pytest.raises(MissingExtraError, match=r"the diagnostics figures .*peft-grounded\[plots\]"):
        import peft_grounded.diagnostics.plots  # noqa: F401
    monkeypatch.delitem(sys.modules, "peft_grounded.diagnostics.plots", raising=False)

    with pytest.raises(KeyError, match="not the module of an extra"):
        require("torch", "anything")


def test_an_import_failing_inside_an_installed_extra_is_not_renamed(monkeypatch, tmp_path):
    """Only the extra's own package missing is a missing extra; a broken dependency of it keeps its error."""
    (tmp_path / "probe_extra").mkdir()
    (tmp_path / "probe_extra" / "__init__.py").write_text("import probe_dependency_not_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(EXTRA_OF, "probe_extra", ("probe-extra", "sids"))
    with pytest.raises(ModuleNotFoundError) as caught:
        require("probe_extra", "a probe")
    assert not isinstance(caught.value, MissingExtraError)
    assert caught.value.name == "probe_dependency_not_installed"
    monkeypatch.setitem(EXTRA_OF, "probe_not_installed", ("probe-not-installed", "demo"))
    with pytest.raises(MissingExtraError, match=r"a probe needs probe-not-installed.*peft-grounded\[demo\]"):
        require("probe_not_installed.sub", "a probe")


def _clean_env() -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    return keep | {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@pytest.mark.slow  # a fresh interpreter importing torch, transformers and peft: 10-30 s on a busy machine
def test_the_core_runs_with_the_extras_hidden(tmp_path):
    env = _clean_env() | {"PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--hide-extras"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert out.returncode == 0 and "core-only: ok" in out.stdout, out.stderr[-3000:]


@pytest.mark.slow  # a new virtual environment: torch from the local wheels, the core's packages from PyPI (minutes)
def test_a_fresh_environment_with_the_core_alone(tmp_path):
    src = tmp_path / "src"  # install from a copy: no build/ or egg-info churn in the checkout
    shutil.copytree(PACKAGE, src / "peft_grounded", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    env = _clean_env()
    pip = [python, "-m", "pip", "--disable-pip-version-check", "-q", "install"]
    for what in (["torch==2.13.0"], [str(src)]):  # torch first, as the README says; then the core, no extras
        out = subprocess.run([*pip, *what], capture_output=True, text=True, env=env, timeout=1500)
        assert out.returncode == 0, out.stderr[-3000:]
    out = subprocess.run(  # cwd: not the checkout, which would shadow the installed package
        [python, str(SCRIPT), "--check-not-installed"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    assert out.returncode == 0 and "core-only: ok" in out.stdout, out.stderr[-3000:]
    where = subprocess.run(
        [python, "-c", "import peft_grounded; print(peft_grounded.__file__)"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert str(venv) in where.stdout, where.stdout + where.stderr
