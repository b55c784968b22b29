"""Share grounded adapters on the Hugging Face Hub: push, load, model card.

Exports are lazy, so ``import peft_grounded.hub`` (e.g. for the CLI) stays light:

- :func:`push_grounded` (``.push``): one commit with the adapter, card, SID index and tokenizer.
- :func:`load_grounded` (``.load``): check base and tokenizer, add the tokens, ``PeftModel.from_pretrained``.
- :func:`load_sid_index`, :func:`pull_grounded`: the SID index, or every safe file into a folder.
- :func:`render_model_card` and its facts (``.card``).
"""

from __future__ import annotations

from .._lazy import lazy_exports

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


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
