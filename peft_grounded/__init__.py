"""peft_grounded: grounded and centroid initialisation of new vocabulary (Semantic-ID tokens) as a PEFT method.

``import peft_grounded`` registers the ``GROUNDED_TOKENS`` method with PEFT, so that ``get_peft_model``,
``PeftConfig.from_pretrained``, ``PeftModel.from_pretrained`` and ``load_adapter`` handle it.

The package imports lazily, so that the command line starts without torch: the names below load on first use,
and the registration happens when PEFT is imported (at once when it already is, else right after ``import
peft`` completes, by a hook that this import installs).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from typing import Any

from . import _quiet
from ._imports import lazy_exports

__version__ = "0.1.0"

__getattr__, __dir__, _lazy_names = lazy_exports(
    __name__,
    {
        "adapter": (
            "GROUNDED_TOKENS AddedTokens GroundedProvenance GroundedRuntimeConfig GroundedTokenConfig "
            "GroundedTokenModel add_lora add_tokens check_tokenizer initialize_grounded_rows"
        ),
        "sids.index": "add_sid_tokens",
        "serving": "GroundedRecommender",
    },
)

__all__ = ["__version__", *_lazy_names]


def _register() -> None:
    """Register the method with PEFT (importing the adapter does it)."""
    importlib.import_module(".adapter", __name__)


class _ThenRegister(importlib.abc.Loader):
    """PEFT's own loader, followed by the registration once ``peft`` has executed."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        for finder in [f for f in sys.meta_path if isinstance(f, _RegisterWithPeft)]:
            sys.meta_path.remove(finder)
        _register()

    def __getattr__(self, name: str) -> Any:  # resources, source and the like: PEFT's loader answers
        return getattr(self._loader, name)


class _RegisterWithPeft(importlib.abc.MetaPathFinder):
    """Finds ``peft`` like the other finders do, with :class:`_ThenRegister` around its loader. It stays on
    ``sys.meta_path`` until ``peft`` executes: a mere lookup (``importlib.util.find_spec("peft")``, which TRL
    and transformers make to see whether PEFT is installed) must not use it up."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "peft" or "peft" in sys.modules:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _ThenRegister(spec.loader)
                return spec
        return None


if "peft" in sys.modules:
    _register()
elif not any(isinstance(finder, _RegisterWithPeft) for finder in sys.meta_path):
    sys.meta_path.insert(0, _RegisterWithPeft())

# DeepSpeed's "Setting accelerator to CPU" notice, which accelerate's unwrapping makes it log once per process
# on a machine without a GPU (see _quiet); a logging filter, nothing is imported
_quiet.quiet_deepspeed_cpu_notice()
