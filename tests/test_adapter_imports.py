"""The PEFT method stands alone (docs/layout.md): ``peft_grounded.adapter`` imports torch, transformers, PEFT and
their own dependencies, plus three leaf helpers of the package, and nothing of the recommender built on it
(SIDs, prompts, TRL's losses, the packaged model, the harness). Every import is read, lazy ones included."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ADAPTER = ROOT / "peft_grounded" / "adapter"
THIRD_PARTY = {
    "torch",
    "transformers",
    "peft",
    "safetensors",
    "numpy",
    "accelerate",
    "huggingface_hub",
    "deepspeed",
}
LEAF_HELPERS = frozenset(("peft_grounded.checks", "peft_grounded._io", "peft_grounded.checks"))


def _imports(path: Path) -> list[str]:
    """Absolute names of everything ``path`` imports, at any depth (functions, methods, branches)."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
                # ``from .. import checks`` names a module through the package
                names += [f"{module}.{a.name}" if not node.module else module for a in node.names]
            else:
                names.append(node.module or "")
    return names


def _outside(name: str) -> bool:
    """Whether ``name`` is an import the adapter may not make."""
    top = name.split(".")[0]
    if top == "peft_grounded":
        return not (name.startswith("peft_grounded.adapter") or name in LEAF_HELPERS)
    return top not in THIRD_PARTY and top not in sys.stdlib_module_names and top != "__future__"


def test_the_adapter_imports_only_torch_transformers_peft_and_itself():
    offenders = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in sorted(ADAPTER.rglob("*.py"))
        for name in _imports(path)
        if _outside(name)
    ]
    assert not offenders, offenders


def test_the_leaf_helpers_import_nothing_of_the_package():
    for name in LEAF_HELPERS:
        path = ROOT / Path(*name.split(".")).with_suffix(".py")
        assert not [n for n in _imports(path) if _outside(n) or n.startswith("peft_grounded")], path


def test_the_check_catches_an_import_of_the_recommender():
    """The rule reads lazy imports too: a SID, prompt or TRL import inside a function is an offender."""
    assert _outside("peft_grounded.sids.index") and _outside("peft_grounded.prompts") and _outside("trl")
    assert not _outside("peft_grounded.adapter.layer") and not _outside("peft.tuners.lora")
