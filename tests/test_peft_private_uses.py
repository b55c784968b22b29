"""docs/peft_trl_limitations.md against the code: every use of a private name of PEFT, TRL or transformers that
a test can find in ``peft_grounded/`` is listed in its table, every one listed is in the file it names, and the
versions it was checked against are the installed ones, within the pins of pyproject.toml.

What is found: private names imported (``from peft.tuners._buffer_dict import ...``, ``from x import _y``) and
read off an imported name (``LoraModel._create_new_module``); private methods and attributes of PEFT's, TRL's and
transformers' classes that the package's subclasses override or use (``self._x``, ``super()._x``); private
attributes read by ``getattr`` on their configs, models and trainers; the namespaces where
``get_peft_model_state_dict`` is replaced; the ``sys.meta_path`` hook.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import sys
import textwrap
from collections import defaultdict
from functools import cache
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "peft_grounded"
DOC = ROOT / "docs" / "peft_trl_limitations.md"
SECTION = "## Where the package reaches inside PEFT, TRL and transformers"
UPSTREAM = ("peft", "trl", "transformers")
IGNORED = frozenset({"_abc_impl"})  # abc's bookkeeping on every ABC subclass, nobody's API


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _upstream(module: str | None) -> bool:
    return bool(module) and module.split(".")[0] in UPSTREAM


def _where(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def _files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


# --- the doc ------------------------------------------------------------------------------------------------


def listed() -> dict[str, set[str]]:
    """The doc table's private uses (second column), each with the files its row names (first column)."""
    text = DOC.read_text()
    assert SECTION in text, f"{DOC.name} lost its section {SECTION!r}"
    rows: dict[str, set[str]] = defaultdict(set)
    for line in text.split(SECTION, 1)[1].split("\n## ", 1)[0].splitlines():
        cells = line.split("|")
        if len(cells) < 4 or set(cells[1].strip()) <= {"-", ":", " "} or cells[1].strip() == "where":
            continue
        files = set(re.findall(r"`([\w/]+\.py)", cells[1]))
        assert files, f"a row of the table names no file: {line[:120]}"
        for use in re.findall(r"`([^`]+)`", cells[2]):
            rows[use] |= files
    return dict(rows)


# --- the code -------------------------------------------------------------------------------------------------


def found_by_reading() -> dict[str, set[str]]:
    """Private imports, names read off imported upstream names, and the ``sys.meta_path`` hook (by AST)."""
    uses: dict[str, set[str]] = defaultdict(set)
    for path in _files():
        tree = ast.parse(path.read_text())
        aliases: dict[str, str] = {}  # local name -> the upstream name it stands for
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and _upstream(node.module):
                for alias in node.names:
                    aliases[alias.asname or alias.name] = alias.name
                    if _private(alias.name) or any(_private(p) for p in node.module.split(".")):
                        uses[f"{node.module}.{alias.name}"].add(_where(path))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if _upstream(alias.name):
                        local = alias.asname or alias.name.split(".")[0]
                        aliases[local] = local if alias.asname is None else alias.name
                        if any(_private(p) for p in alias.name.split(".")):
                            uses[alias.name].add(_where(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                chain, base = [node.attr], node.value
                while isinstance(base, ast.Attribute):
                    chain.append(base.attr)
                    base = base.value
                if isinstance(base, ast.Name) and base.id in aliases:
                    uses[".".join([aliases[base.id], *reversed(chain)])].add(_where(path))
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("insert", "append")
                and ast.unparse(node.func.value) == "sys.meta_path"
            ):
                uses["sys.meta_path"].add(_where(path))
    return dict(uses)


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _may_subclass_upstream(path: Path) -> bool:
    """Whether ``path`` defines a class with a base (an upstream class, or one of the package's that may have
    one): the modules worth importing to look at their classes."""
    return any(isinstance(n, ast.ClassDef) and n.bases for n in ast.parse(path.read_text()).body)


@cache
def _upstream_source(cls: type) -> str:
    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):
        return ""


def _is_upstream(cls: type) -> bool:
    return _upstream(cls.__module__)


def _owner(mro: list[type], name: str) -> type | None:
    """The first upstream class of ``mro`` that defines ``name``, or sets it on ``self`` in its source."""
    for cls in mro:
        if name in cls.__dict__:
            return cls
    return next((cls for cls in mro if re.search(rf"\bself\.{name}\b", _upstream_source(cls))), None)


def found_by_importing() -> dict[str, set[str]]:
    """Private members of upstream classes that the package's subclasses override or use, private attributes
    read by ``getattr`` off upstream objects, and the namespaces where ``get_peft_model_state_dict`` is replaced."""
    import peft_grounded.adapter  # noqa: F401  (registers the method: PEFT's namespaces as they are in use)

    uses: dict[str, set[str]] = defaultdict(set)
    modules = [importlib.import_module(_module_name(p)) for p in _files() if _may_subclass_upstream(p)]
    subclasses = {
        cls
        for module in modules
        for cls in vars(module).values()
        if inspect.isclass(cls)
        and cls.__module__.startswith("peft_grounded")
        and any(_is_upstream(b) for b in cls.__mro__)
    }
    for cls in subclasses:
        theirs = [b for b in cls.__mro__ if _is_upstream(b)]
        ours = [b for b in cls.__mro__ if b.__module__.startswith("peft_grounded")]
        for part in ours:
            where = _where(Path(inspect.getfile(part)))
            names = {n for n in part.__dict__ if _private(n)}
            for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(part)))):
                if isinstance(node, ast.Attribute) and _private(node.attr):
                    value = node.value
                    if (isinstance(value, ast.Name) and value.id in ("self", "cls")) or (
                        isinstance(value, ast.Call) and ast.unparse(value.func) == "super"
                    ):
                        names.add(node.attr)
            for name in names - IGNORED:
                if any(name in b.__dict__ for b in ours) and not any(name in b.__dict__ for b in theirs):
                    continue  # the package's own method or attribute
                owner = _owner(theirs, name)
                if owner is not None:
                    uses[f"{owner.__name__}.{name}"].add(where)
    uses.update(_getattr_strings())
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] == "peft" and getattr(
            getattr(module, "get_peft_model_state_dict", None), "_grounded_patch", False
        ):
            uses[f"{name}.get_peft_model_state_dict"].add("adapter/saved.py")
    return dict(uses)


def _getattr_strings() -> dict[str, set[str]]:
    """``getattr(x, "_name")`` where ``_name`` belongs to one of the upstream classes the package handles."""
    from peft import PeftModel
    from peft.tuners.tuners_utils import BaseTuner, BaseTunerLayer
    from transformers import PretrainedConfig, PreTrainedModel, Trainer
    from trl import SFTTrainer

    classes = [PretrainedConfig, PreTrainedModel, PeftModel, BaseTuner, BaseTunerLayer, SFTTrainer, Trainer]
    uses: dict[str, set[str]] = defaultdict(set)
    for path in _files():
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr", "setattr", "delattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
                and _private(node.args[1].value)
            ):
                name = node.args[1].value
                owner = next((c for c in classes if any(name in b.__dict__ for b in c.__mro__)), None)
                if owner is not None:
                    uses[f"{owner.__name__}.{name}"].add(_where(path))
    return dict(uses)


# --- the checks -----------------------------------------------------------------------------------------------


def test_every_private_use_found_in_the_code_is_in_the_doc_and_every_listed_one_in_the_code():
    found: dict[str, set[str]] = defaultdict(set)
    for part in (found_by_reading(), found_by_importing()):
        for use, files in part.items():
            found[use] |= files
    doc = listed()
    assert sorted(set(found) - set(doc)) == [], f"private uses missing from {DOC.name}"
    assert sorted(set(doc) - set(found)) == [], f"{DOC.name} lists private uses the code no longer has"
    for use, files in found.items():
        assert files <= doc[use], f"{use} is used in {sorted(files)}; the doc's row names {sorted(doc[use])}"


def test_every_listed_use_is_in_the_file_its_row_names():
    for use, files in listed().items():
        name = use.rsplit(".", 1)[-1]
        for where in files:
            assert name in (PACKAGE / where).read_text(), f"{DOC.name}: {name} is not in {where}"


def test_the_doc_names_the_installed_versions_and_the_pins():
    text = DOC.read_text()
    pyproject = (ROOT / "pyproject.toml").read_text()
    for package, label in (("peft", "PEFT"), ("trl", "TRL"), ("transformers", "transformers")):
        checked = re.search(rf"\b{label} (\d[\w.]*)", text)
        assert checked and checked.group(1) == version(package), (
            f"{DOC.name} was checked against {label} {checked and checked.group(1)} but {version(package)} is "
            "installed: check each private use against it, then update the versions in the doc"
        )
        pin = re.search(rf'"({package}[<>=~!][^"]*)"', pyproject).group(1)
        assert f"`{pin}`" in text, f"{DOC.name} does not name pyproject.toml's pin {pin}"


def test_the_key_error_section_says_what_the_code_does():
    """No ``adapter_config.json`` field carries a hint (the doc once described one), and the model card's "How to
    load" code opens with ``import peft_grounded``, as the doc says."""
    from peft_grounded import GroundedTokenConfig

    assert "peft_grounded" not in GroundedTokenConfig(token_indices=[5]).to_dict()
    assert '"peft_grounded"' not in DOC.read_text()
    card = (PACKAGE / "hub" / "templates" / "grounded_adapter.md").read_text()
    code = card.split("## How to load", 1)[1].split("```python", 1)[1]
    assert code.lstrip().startswith("import peft_grounded\n")
