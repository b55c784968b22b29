"""Share grounded adapters on the Hugging Face Hub: push, load, model card.

Exports are lazy, so ``import peft_grounded.hub`` (e.g. for the CLI) stays light:

- :func:`push_grounded` (``.push``): one commit with the adapter, card, SID index and tokenizer.
- :func:`load_grounded` (``.load``): check base and tokenizer, add the tokens, ``PeftModel.from_pretrained``.
- :func:`load_sid_index`, :func:`pull_grounded`: the SID index, or every safe file into a folder.
- :func:`render_model_card` and its facts (``.card``).
"""

from __future__ import annotations

from .._imports import lazy_exports

_LAZY = {  # module: the names it exports
    "push": "push_grounded",
    "load": "load_grounded load_sid_index prepare_base pull_grounded",
    "repo": "GroundedHubError check_repo_id",
    "card": "render_model_card GroundedCardFacts SIDFacts InitFacts GroundingFacts",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _LAZY)
