"""One SASRec fit per training data and settings: the behaviour SIDs, the distillation teacher and the SASRec peer
of a run ask for the same fit, so :func:`shared_fit` trains it once and saves it under the package's cache
(``<peft_grounded cache>/sasrec/``, :func:`peft_grounded.assets.cache_dir`), keyed by :func:`fit_key`."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import asdict
from typing import Any

from .sasrec import CONFIG_FILE, SASRecConfig, SASRecRecommender, _fit, _indexed

logger = logging.getLogger(__name__)


def fit_key(
    histories: Sequence[Sequence[int]],
    valid_targets: Sequence[int],
    item_ids: Sequence[str],
    config: SASRecConfig,
) -> str:
    """SHA-256 of what a fit depends on: the indexed training histories and validation targets, the item ids
    and every setting but ``threads``."""
    settings = {k: v for k, v in asdict(config).items() if k != "threads"}
    payload = json.dumps([list(map(list, histories)), list(valid_targets), list(item_ids), settings])
    return hashlib.sha256(payload.encode()).hexdigest()


def shared_fit(
    split: Any,
    item_ids: Sequence[str],
    config: SASRecConfig | None = None,
    *,
    show_progress: bool = False,
) -> SASRecRecommender:
    """:func:`~peft_grounded.sids.sasrec.fit_sasrec`'s recommender, read from the cache where an equal fit
    (same histories, validation targets, items and settings) was saved, else trained and saved there. A fit
    under ``max_minutes`` depends on the machine's speed: it is trained, never cached. ``show_progress``: a
    fit shows its epochs on stderr (validation Recall, time left; see :func:`~.sasrec.epoch_progress`)."""
    config = config or SASRecConfig()
    item_ids = list(item_ids)
    _, histories, valid_targets = _indexed(split, item_ids)
    if config.max_minutes is not None:
        return _fit(histories, valid_targets, item_ids, config, show_progress=show_progress)
    from .. import assets

    key = fit_key(histories, valid_targets, item_ids, config)
    folder = assets.cache_dir() / "sasrec" / key[:24]
    with suppress(FileNotFoundError, ValueError, KeyError):
        saved = SASRecRecommender.load(folder)
        if json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8")).get("fit_key") == key:
            logger.info("SASRec: the fit saved in %s (same data and settings)", folder)
            return saved
    recommender = _fit(histories, valid_targets, item_ids, config, show_progress=show_progress)
    recommender.save(folder, fit_key=key)
    return recommender
