"""The grounded-token adapter as a PEFT method (``PeftType.GROUNDED_TOKENS``)."""

from .config import GroundedProvenance, GroundedRuntimeConfig, GroundedTokenConfig
from .initialize import AddedTokens, add_tokens, check_tokenizer, initialize_grounded_rows, vocab_fingerprint
from .layer import GroundedHead, GroundedTiedEmbedding, GroundedTokenLayer
from .lora import add_lora
from .model import GroundedTokenModel
from .saved import GROUNDED_TOKENS, register

register(GroundedTokenConfig, GroundedTokenModel)

__all__ = [
    "GROUNDED_TOKENS",
    "AddedTokens",
    "GroundedHead",
    "GroundedProvenance",
    "GroundedRuntimeConfig",
    "GroundedTiedEmbedding",
    "GroundedTokenConfig",
    "GroundedTokenLayer",
    "GroundedTokenModel",
    "add_lora",
    "add_tokens",
    "check_tokenizer",
    "initialize_grounded_rows",
    "vocab_fingerprint",
]
