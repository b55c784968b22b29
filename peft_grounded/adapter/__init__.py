"""The grounded-token adapter as a PEFT method (``PeftType.GROUNDED_TOKENS``)."""

from .config import GroundedProvenance, GroundedRuntimeConfig, GroundedTokenConfig
from .initialize import initialize_grounded_rows
from .layer import GroundedHead, GroundedTiedEmbedding, GroundedTokenLayer
from .lora import add_lora
from .model import GroundedTokenModel
from .registration import GROUNDED_TOKENS, register
from .vocab import AddedTokens, add_tokens, check_tokenizer, vocab_fingerprint

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
