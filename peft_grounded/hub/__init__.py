"""Share grounded adapters on the Hugging Face Hub: push, load, model card.

Exports are lazy, so ``import peft_grounded.hub`` (e.g. for the CLI) stays light:

- :func:`push_grounded` (``.push``): one commit with the adapter, card, SID index and tokenizer.
- :func:`load_grounded` (``.load``): check base and tokenizer, add the tokens, ``PeftModel.from_pretrained``.
- :func:`load_sid_index`, :func:`pull_grounded`: the SID index, or every safe file into a folder.
- :func:`render_model_card` and its facts (``.card``).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "push_grounded": "push",
    "load_grounded": "load",
    "load_sid_index": "load",
    "prepare_base": "load",
    "pull_grounded": "pull",
    "GroundedHubError": "repo",
    "check_repo_id": "repo",
    "render_model_card": "card",
    "GroundedCardFacts": "card",
    "SIDFacts": "card",
    "InitFacts": "card",
    "GroundingFacts": "card",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
