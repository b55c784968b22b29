"""Semantic IDs: catalogues, item-text encoders, residual k-means and the SID index.

Typical use::

    from peft_grounded.sids import build_sids, SIDIndex, load_catalogue

    index = build_sids("movielens-100k", "out/sids")          # or load: SIDIndex.load("out/sids")
    tokens, vectors = index.adapter_init(variant="items")    # rows follow `tokens`
    index.sid_text("1")                                       # '<a_12><b_3><c_200><d_0>'

    catalogue = load_catalogue("movielens-100k")
    split = catalogue.leave_one_out()                         # train / valid / test targets
    cold = split.cold_items(max_count=1)

Heavy dependencies (torch, sentence-transformers) load on first use of the names that need them.
"""

from __future__ import annotations

from .._imports import lazy_exports
from .index import (
    DEFAULT_TEMPLATE,
    add_sid_tokens,
    level_name,
    parse_sid,
    sid_string,
    sid_token,
    sid_vocabulary,
)

_LAZY = {  # module: the names it exports
    "catalogue": "Catalogue CatalogueError Item LeaveOneOut LoadReport UserSplit TextTemplate",
    "catalogue_source": "CatalogueMismatchError CatalogueSource index_catalogue",
    "loaders": "as_catalogue load_catalogue load_lcrec load_amazon load_movielens load_recbole load_table",
    "encoders": "TextEncoder SentenceTransformerEncoder LMEncoder load_encoder encode_texts",
    "build": "encode_items EncodedItems build_sids index_from_vectors",
    "quantizers": "RQKMeansConfig fit_rqkmeans RQVAEConfig fit_rqvae",
    "kmeans": "QuantizationError kmeans",
    "index": "SIDIndex IndexFileError EncoderMismatchError",
    "extended_base": "RowStart",
}

__getattr__, __dir__, _lazy_names = lazy_exports(__name__, _LAZY)

__all__ = [
    "DEFAULT_TEMPLATE",
    "add_sid_tokens",
    "level_name",
    "parse_sid",
    "sid_string",
    "sid_token",
    "sid_vocabulary",
    *_lazy_names,
]
