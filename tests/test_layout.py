"""docs/layout.md is a caption of the package's tree: every folder it names exists and holds exactly the modules
it lists, every package folder is named, and no folder imports one captioned after it. Module sizes follow their
concerns: there is no cap on lines or files."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "peft_grounded"
LAYOUT = ROOT / "docs" / "layout.md"
ROW = re.compile(r"^\|\s*`(peft_grounded/[\w/]*)`\s*\|([^|]*)\|", re.M)


def _caption() -> dict[Path, set[str]]:
    rows = {}
    for folder, modules in ROW.findall(LAYOUT.read_text(encoding="utf-8")):
        path = ROOT / folder.rstrip("/")
        assert path not in rows, f"{folder} is captioned twice"
        rows[path] = set(re.findall(r"`(\w+)`", modules))
    return rows


def _modules(folder: Path) -> set[str]:
    return {p.stem for p in folder.glob("*.py") if not p.name.startswith("__")}


def _python_files() -> list[Path]:
    return [p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts]


def test_every_folder_named_exists_and_holds_the_modules_listed():
    rows = _caption()
    assert rows, "docs/layout.md captions no folder"
    for folder, listed in rows.items():
        assert folder.is_dir(), f"docs/layout.md names {folder.relative_to(ROOT)}/, which does not exist"
        actual = _modules(folder)
        assert listed == actual, (
            f"{folder.relative_to(ROOT)}/: docs/layout.md lists {sorted(listed - actual)} that it does not "
            f"hold and leaves out {sorted(actual - listed)}"
        )


def test_every_package_folder_is_named():
    rows = _caption()
    folders = [PACKAGE, *(p.parent for p in PACKAGE.rglob("__init__.py") if "__pycache__" not in p.parts)]
    folders += [p for p in PACKAGE.rglob("*") if p.is_dir() and "__pycache__" not in p.parts]
    missing = sorted({str(f.relative_to(ROOT)) for f in folders if f not in rows})
    assert not missing, f"docs/layout.md does not caption {missing}"


def _folder_imports() -> dict[str, set[str]]:
    """Top-level folder of the package -> the top-level folders its modules import (lazy imports included);
    the package root's own modules count as folder ``""``."""
    import ast

    def folder_of(dotted: str) -> str:
        parts = dotted.split(".")[1:]  # below peft_grounded
        return parts[0] if parts and (PACKAGE / parts[0]).is_dir() else ""

    edges: dict[str, set[str]] = {}
    for path in _python_files():
        rel = path.relative_to(ROOT).with_suffix("").parts
        package = rel if path.name == "__init__.py" else rel[:-1]
        package = package[:-1] if path.name == "__init__.py" else package
        if path == PACKAGE / "__init__.py":
            continue  # the root's lazy table names the adapter's exports (strings, not imports)
        source = folder_of(".".join(rel))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = list(package)[: len(package) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("peft_grounded"):
                target = node.module
            else:
                continue
            edges.setdefault(source, set()).add(folder_of(target))
    return edges


def test_no_folder_imports_one_captioned_above_it():
    """The caption's order is the layers' order: each folder imports only folders listed before it (or itself),
    so the folders hold no import cycle."""
    order: list[str] = []
    for path in _caption():
        parts = path.relative_to(PACKAGE).parts
        top = parts[0] if parts else ""
        if top not in order:
            order.append(top)
    upward = sorted(
        f"peft_grounded/{source}/ imports peft_grounded/{target}/"
        for source, targets in _folder_imports().items()
        for target in targets
        if target in order and order.index(target) > order.index(source)
    )
    assert not upward, f"folders that import a folder docs/layout.md lists after them: {upward}"
