"""Items -> text -> vectors, the one encode step of ``build_sids`` (a new index) and ``add_items`` (new items
of an index): render each item under a template, refuse or drop those whose text is empty, load the encoder,
let the caller check it (and the kept items) before the slow part, encode through the cache."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .catalogue import CatalogueError, Item
from .encoders import TextEncoder, encode_texts, load_encoder
from .text import TextTemplate

logger = logging.getLogger(__name__)


@dataclass
class EncodedItems:
    """What :func:`encode_items` gives: the items kept (in order), one vector row each, the encoder that
    made them, the ids dropped for empty text, and the seconds the encoding took."""

    items: list[Item]
    vectors: np.ndarray
    encoder: TextEncoder
    dropped: list[str] = field(default_factory=list)
    seconds: float = 0.0


def encode_items(
    items: Sequence[Item],
    template: TextTemplate,
    encoder: TextEncoder | str | None = None,
    *,
    empty_text: str = "error",
    what: str = "items",
    fields_of: str = "the template",
    fix: str = "give them text",
    before_encoding: Callable[[list[Item], TextEncoder], Any] | None = None,
    device: str = "cpu",
    batch_size: int = 64,
    cache_dir: str | Path | None = None,
    use_cache: bool = True,
    show_progress: bool = True,
) -> EncodedItems:
    """Encode ``items`` rendered by ``template`` with ``encoder`` (a TextEncoder or a ``load_encoder`` spec).

    Items whose text is empty: a :class:`CatalogueError` naming ``what``, ``fields_of`` and ``fix`` (``empty_text="error"``),
    or left out (``"drop"``; :attr:`EncodedItems.dropped` lists them; none left is an error).
    ``before_encoding(kept_items, encoder)`` runs after the encoder loads and before anything is encoded,
    so a caller's checks (the index's encoder, enough items for the codes) stop before the slow part."""
    if empty_text not in ("error", "drop"):
        raise ValueError(f"empty_text must be 'error' or 'drop', got {empty_text!r}")
    kept, texts = list(items), template.render_all(items)
    empty = [it.item_id for it, text in zip(kept, texts, strict=True) if not text]
    if empty and empty_text == "error":
        raise CatalogueError(
            f"{len(empty)} {what} have no text in {fields_of} fields {list(template.fields)} "
            f"(e.g. {empty[:5]}); {fix}, or pass empty_text='drop' (--drop-empty-text) to leave them out"
        )
    if empty:
        kept = [it for it, text in zip(kept, texts, strict=True) if text]
        texts = [text for text in texts if text]
        logger.warning("dropped %d %s whose text under fields %s is empty", len(empty), what, template.fields)
        if not kept:
            raise CatalogueError(
                f"none of the {len(empty)} {what} has text in {fields_of} fields {list(template.fields)}; {fix}"
            )
    enc = load_encoder(encoder, device)
    if before_encoding is not None:
        before_encoding(kept, enc)
    start = time.perf_counter()
    vectors = encode_texts(
        texts,
        enc,
        batch_size=batch_size,
        cache_dir=cache_dir,
        use_cache=use_cache,
        show_progress=show_progress,
    )
    return EncodedItems(kept, vectors, enc, empty, time.perf_counter() - start)
