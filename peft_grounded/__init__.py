"""peft_grounded: grounded and centroid initialisation of new vocabulary (Semantic-ID tokens) as a PEFT method.

``import peft_grounded`` registers the ``GROUNDED_TOKENS`` method with PEFT, so that ``get_peft_model``,
``PeftConfig.from_pretrained``, ``PeftModel.from_pretrained`` and ``load_adapter`` handle it.
"""

from .adapter import (
    GROUNDED_TOKENS,
    AddedTokens,
    GroundedTokenConfig,
    GroundedTokenModel,
    add_lora,
    add_sid_tokens,
    add_tokens,
    check_tokenizer,
)

__version__ = "0.1.0"

__all__ = [
    "GROUNDED_TOKENS",
    "AddedTokens",
    "GroundedTokenConfig",
    "GroundedTokenModel",
    "__version__",
    "add_lora",
    "add_sid_tokens",
    "add_tokens",
    "check_tokenizer",
]
