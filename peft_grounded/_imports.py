"""What loads when: lazy package exports, and the modules of the optional extras.

* :func:`lazy_exports` (PEP 562): a package names what it exports and from which of its modules, and the
  module loads on first use, so that importing the package (e.g. for the command line) stays light.
* :func:`require`: the core install (``pip install peft-grounded``) is the adapter with PEFT, TRL and torch;
  SID building, figures and the demo's GGUF reader come with extras. :func:`require` imports a module of an
  extra, or raises :class:`MissingExtraError` naming the extra that installs it (see docs/layout.md).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any


def lazy_exports(
    package: str, modules: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``(__getattr__, __dir__, names)`` for ``package``.

    ``modules`` maps a submodule to the names it defines, space-separated (``{"config": "RunConfig
    check_run_config"}``); ``names`` lists them all, in that order, for ``__all__``.
    """
    exports = {name: module for module, names in modules.items() for name in names.split()}

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", package), name)
        setattr(sys.modules[package], name, value)  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *exports})

    return __getattr__, __dir__, list(exports)


# Optional dependencies: the core install (``pip install peft-grounded``) is the adapter with PEFT, TRL and
# torch; SID building, figures and the demo's GGUF reader come with extras. :func:`require` imports a module
# of an extra, or raises :class:`MissingExtraError` naming the extra that installs it (see docs/layout.md).

# top-level module -> (the PyPI package, the extra that brings it)
EXTRA_OF: dict[str, tuple[str, str]] = {
    "sentence_transformers": ("sentence-transformers", "sids"),
    "scipy": ("scipy", "sids"),
    "matplotlib": ("matplotlib", "plots"),
    "gguf": ("gguf", "demo"),
}


class MissingExtraError(ModuleNotFoundError):
    """A module of an extra that is not installed; the message names ``pip install 'peft-grounded[extra]'``."""


def require(module: str, what: str) -> ModuleType:
    """Import ``module`` (of an extra in :data:`EXTRA_OF`) for ``what`` (the feature that needs it, for the
    message); a missing package raises :class:`MissingExtraError`; an import failing inside it is left as is."""
    top = module.split(".")[0]
    if top not in EXTRA_OF:
        raise KeyError(f"{module!r} is not the module of an extra ({sorted(EXTRA_OF)})")
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name is None or err.name.split(".")[0] != top:
            raise
        package, extra = EXTRA_OF[top]
        raise MissingExtraError(
            f"{what} needs {package}, which the core install of peft-grounded leaves out: "
            f"pip install 'peft-grounded[{extra}]' (or '[all]'; from a clone: pip install '.[{extra}]')",
            name=top,
        ) from err
