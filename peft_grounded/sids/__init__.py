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

from .._lazy import lazy_exports
from .tokens import DEFAULT_TEMPLATE, level_name, parse_sid, sid_string, sid_token, sid_vocabulary

_LAZY = {
    "Catalogue": "catalogue",
    "CatalogueError": "catalogue",
    "Item": "catalogue",
    "LeaveOneOut": "catalogue",
    "LoadReport": "catalogue",
    "UserSplit": "catalogue",
    "load_catalogue": "loaders",
    "load_lcrec": "loaders",
    "load_amazon": "loaders",
    "load_movielens": "loaders",
    "load_recbole": "loaders",
    "load_table": "loaders",
    "TextTemplate": "text",
    "TextEncoder": "encoders",
    "SentenceTransformerEncoder": "encoders",
    "LMEncoder": "encoders",
    "load_encoder": "encoders",
    "encode_texts": "encoders",
    "encode_items": "item_vectors",
    "EncodedItems": "item_vectors",
    "RQKMeansConfig": "rqkmeans",
    "QuantizationError": "kmeans",
    "fit_rqkmeans": "rqkmeans",
    "kmeans": "kmeans",
    "RQVAEConfig": "rqvae",
    "fit_rqvae": "rqvae",
    "SIDIndex": "index",
    "IndexFileError": "index",
    "EncoderMismatchError": "index",
    "build_sids": "build",
    "index_from_vectors": "build",
}

__all__ = [
    "DEFAULT_TEMPLATE",
    "level_name",
    "parse_sid",
    "sid_string",
    "sid_token",
    "sid_vocabulary",
    *_LAZY,
]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
