"""From saved checkpoints and their SID index to the report: :func:`diagnose` and :func:`diagnose_runs`.

Per checkpoint, the SID rows come from the adapter (in the index's token order); the rest is shared:

* vocabulary rows and strings: the base model named in the adapters' config (or ``base_model``);
* reference vectors: the index's per-token centroids (``reference="items"``, the default, as the
  runner's centroid init uses them; ``"codebook"``; or ``None``);
* code frequencies: how often each code is a training target under the leave-one-out split
  (``split``, or the catalogue's), else the index's interaction counts;
* categories: the majority level-0 label per code, from the catalogue or the categories the index
  stored at build time; purity is skipped, with a note, when there are none.

The report lists where each input came from and what was left out.

How items spread over the SID codes (per-token frequencies, the majority label of each code), read from the
SID index for the report, is below.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from peft_grounded._io import locks_output
from peft_grounded.diagnostics.measure import ReportConfig
from peft_grounded.diagnostics.report import ReportFiles, check_report_output, write_report
from peft_grounded.diagnostics.rows import (
    AdapterRows,
    Checkpoint,
    checkpoint,
    find_run_checkpoints,
    load_sid_rows,
)
from peft_grounded.diagnostics.snapshot import GeometrySnapshot
from peft_grounded.sids.extended_base import FINGERPRINT_KEY, read_sid_record

if TYPE_CHECKING:
    from ..sids.index import SIDIndex


FREQUENCY_SOURCES = ("auto", "targets", "interactions", "items", "none")
MISSING_CATEGORY = "<none>"  # Catalogue.category_labels' placeholder for an item without categories


@locks_output("out_dir", "diagnose")
def diagnose(
    checkpoints: Sequence[str | os.PathLike[str] | Checkpoint],
    index: Any,
    *,
    out_dir: str | os.PathLike[str],
    base_model: Any = None,
    tokenizer: Any = None,
    catalogue: Any = None,
    split: Any = None,
    names: Sequence[str] | None = None,
    stages: Sequence[str] | None = None,
    config: ReportConfig | None = None,
    reference: str | None = "items",
    matrix: str = "input",
    frequencies: str = "auto",
    category_depth: int = 0,
    drop_duplicates: bool = False,
    intro: Sequence[str] = (),
) -> ReportFiles:
    """Diagnose saved grounded adapters against their SID index and write the report into ``out_dir``.

    ``checkpoints``: adapter directories (or :class:`Checkpoint`); ``names`` / ``stages`` label them
    (default: ``<strategy>/<stage>`` for the runner's folders, else the directory name).
    ``index``: a :class:`~peft_grounded.sids.SIDIndex` or its directory. ``base_model``: a local
    checkpoint, a model object, or ``False`` for no vocabulary; default: the adapters'
    ``base_model_name_or_path``. ``catalogue``: a :class:`~peft_grounded.sids.Catalogue` or a path
    for :func:`~peft_grounded.sids.load_catalogue`, checked against the index's record (default: the
    index's own catalogue when it can be found; the report notes when it cannot); ``split``: its leave-one-out split (default:
    the catalogue's). ``frequencies``: ``"auto"`` (training targets if a catalogue or split is
    given, else the index's interactions), ``"targets"``, ``"interactions"``, ``"items"`` or
    ``"none"``. ``matrix="output"`` diagnoses an untied head's rows. ``drop_duplicates`` leaves
    out a checkpoint whose rows equal an earlier one's (e.g. two strategies sharing one init).

    Raises ``ValueError`` before writing anything when a checkpoint holds other tokens than the
    index, was trained with another index, or the base model is not the adapters' base, or when
    ``out_dir`` is a training run's folder or holds another tool's files of the report's names.
    ``out_dir`` is locked from that check to the last write.
    """
    from peft_grounded import checks
    from peft_grounded.sids.catalogue_source import catalogue_at_hand
    from peft_grounded.sids.index import SIDIndex

    check_report_output(out_dir)  # before the (slow) loading of the adapters and the base
    config = config or ReportConfig()
    checks.raise_problems(
        "diagnose", [checks.int_at_least("category_depth", category_depth, 0, flag="--category-depth")]
    )
    sid_index = index if isinstance(index, SIDIndex) else SIDIndex.load(index)
    tokens = sid_index.token_strings
    points = _label(checkpoints, names, stages)
    _check_index_fingerprints(points, sid_index)
    loaded = [load_sid_rows(p.path, tokens, matrix) for p in points]
    notes = list(intro)
    notes.append(
        f"SID index: {sid_index.n_tokens} tokens (levels {list(sid_index.codes_per_level)}), "
        f"{sid_index.n_items} items; rows from the {'untied head' if matrix == 'output' else 'input embedding'}."
    )
    if drop_duplicates:
        points, loaded = _drop_duplicates(points, loaded, notes)

    vocabulary = _vocabulary(base_model, tokenizer, loaded, matrix, notes)
    catalogue = catalogue_at_hand(sid_index, catalogue, needed=False, notes=notes)
    shared: dict[str, Any] = {
        "reference": _reference(sid_index, reference, notes),
        "frequencies": _frequencies(sid_index, frequencies, catalogue, split, notes),
        "categories": _categories(sid_index, catalogue, category_depth, notes),
    }
    if vocabulary is not None:
        shared.update(
            vocab_rows=vocabulary.rows,
            vocab_tokens=vocabulary.tokens,
            exclude_vocab_ids=vocabulary.special_ids or None,
        )
    snapshots = [
        GeometrySnapshot(name=p.name, stage=p.stage, sid_rows=rows.rows, sid_tokens=tokens, **shared)
        for p, rows in zip(points, loaded, strict=True)
    ]
    return write_report(out_dir, snapshots, config, intro=notes)


def diagnose_runs(
    runs_dir: str | os.PathLike[str],
    index: Any,
    *,
    out_dir: str | os.PathLike[str],
    strategies: Sequence[str] | None = None,
    stages: Sequence[str] | None = None,
    seeds: str | Sequence[int] = "first",
    drop_duplicates: bool = True,
    **kwargs: Any,
) -> ReportFiles:
    """:func:`diagnose` every finished stage of every strategy in a runner's output folder.

    ``runs_dir``: one strategy's folder, a folder of them, or the demo's output folder. Checkpoints
    are named ``<strategy>/<stage>`` (see :func:`~peft_grounded.diagnostics.rows.find_run_checkpoints`
    for ``strategies``, ``stages``, ``seeds``). Identical initial rows (``gti/init`` and
    ``mean/init``) are shown once unless ``drop_duplicates=False``. Other keyword arguments go to
    :func:`diagnose` (``base_model``, ``catalogue``, ``split``, ``config``, ...).
    """
    folder = find_run_checkpoints(
        runs_dir,
        strategies=None if strategies is None else list(strategies),
        stages=None if stages is None else list(stages),
        seeds=seeds if isinstance(seeds, str) else list(seeds),
    )
    intro = [
        *kwargs.pop("intro", ()),
        f"Checkpoints: every finished stage in {Path(runs_dir)}.",
        *folder.notes,
    ]
    return diagnose(
        folder.checkpoints, index, out_dir=out_dir, drop_duplicates=drop_duplicates, intro=intro, **kwargs
    )


# ----------------------------------------------------------------------------------------- pieces


def _label(
    checkpoints: Sequence[str | os.PathLike[str] | Checkpoint],
    names: Sequence[str] | None,
    stages: Sequence[str] | None,
) -> list[Checkpoint]:
    if not checkpoints:
        raise ValueError("no checkpoints to diagnose")
    for what, values in (("names", names), ("stages", stages)):
        if values is not None and len(values) != len(checkpoints):
            raise ValueError(
                f"{len(values)} {what} for {len(checkpoints)} checkpoints; give one per checkpoint"
            )
    points = []
    for i, item in enumerate(checkpoints):
        point = item if isinstance(item, Checkpoint) else checkpoint(item)
        name = names[i] if names is not None else point.name
        stage = stages[i] if stages is not None else point.stage
        points.append(Checkpoint(point.path, name, stage, point.index_fingerprint))
    seen: dict[str, Path] = {}
    for point in points:
        if point.name in seen:
            raise ValueError(
                f"two checkpoints are both labelled {point.name!r} ({seen[point.name]} and {point.path}); "
                "pass names= (--name) to tell them apart"
            )
        seen[point.name] = point.path
    return points


def _check_index_fingerprints(points: list[Checkpoint], index: Any) -> None:
    """The runner's manifest, and the adapter itself, record which SID index the tokens belong to."""

    own = index.fingerprint()
    wrong = []
    for point in points:
        recorded = read_sid_record(point.path).get(FINGERPRINT_KEY)
        fingerprints = {point.index_fingerprint, recorded} - {None}
        if fingerprints - {own}:
            wrong.append(point.name)
    if wrong:
        raise ValueError(
            f"{wrong} were trained with another SID index than the one given (their recorded index fingerprint "
            "differs): the same tokens would mean other items. Pass the run's own SID index."
        )


def _drop_duplicates(
    points: list[Checkpoint], loaded: list[AdapterRows], notes: list[str]
) -> tuple[list[Checkpoint], list[AdapterRows]]:
    import torch

    kept: list[tuple[Checkpoint, AdapterRows]] = []
    for point, rows in zip(points, loaded, strict=True):
        twin = next((p for p, r in kept if torch.equal(r.rows, rows.rows)), None)
        if twin is None:
            kept.append((point, rows))
        else:
            notes.append(f"{point.name}: rows identical to {twin.name}, shown once.")
    return [p for p, _ in kept], [r for _, r in kept]


def _vocabulary(
    base_model: Any, tokenizer: Any, loaded: list[AdapterRows], matrix: str, notes: list[str]
) -> Any:
    from peft_grounded.diagnostics.rows import load_vocabulary

    if base_model is False:
        notes.append(
            "No vocabulary (base_model=False): the heatmap has no text tokens, nearest tokens skipped."
        )
        return None
    sizes = {r.original_vocab_size for r in loaded}
    if len(sizes) > 1:
        raise ValueError(
            f"the checkpoints extend vocabularies of different sizes {sorted(sizes)}: compare checkpoints of "
            "one base model"
        )
    if base_model is None:
        recorded = {r.base_model for r in loaded if r.base_model}
        if len(recorded) > 1:
            raise ValueError(
                f"the checkpoints name different base models {sorted(recorded)}; pass base_model= to choose one, "
                "or compare checkpoints of one base model"
            )
        if not recorded:
            notes.append(
                "The adapters name no base model and none was given: no vocabulary rows, so the heatmap has "
                "no text tokens and nearest tokens are skipped."
            )
            return None
        base_model = recorded.pop()
    vocabulary = load_vocabulary(base_model, sizes.pop(), matrix=matrix, tokenizer=tokenizer)
    width = int(loaded[0].rows.shape[1])
    if vocabulary.rows.shape[1] != width:
        raise ValueError(
            f"the base model {vocabulary.source} has width {vocabulary.rows.shape[1]} but the adapters' rows "
            f"have width {width}: not the adapters' base model; pass the right one as base_model"
        )
    if matrix == "input":
        _check_signature(vocabulary, loaded)
    notes.append(f"Vocabulary: {vocabulary.size} rows from {vocabulary.source}.")
    notes.extend(vocabulary.notes)
    return vocabulary


def _check_signature(vocabulary: Any, loaded: list[AdapterRows]) -> None:
    """The adapter recorded the norms of a few base rows; a different base model gives other norms."""
    from peft_grounded.adapter.model import embedding_signature, signature_matches

    signature = embedding_signature(vocabulary.rows, vocabulary.size)
    for rows in loaded:
        recorded = rows.embedding_signature
        if recorded and not signature_matches(recorded, signature):
            raise ValueError(
                f"the vocabulary rows of {vocabulary.source} are not those the adapters were made on (the adapter "
                "records other norms for a few base rows); pass the adapters' base model as base_model"
            )


def _reference(index: Any, variant: str | None, notes: list[str]) -> np.ndarray | None:
    if variant in (None, "none"):
        notes.append("No reference vectors asked for: RSA and the semantic R^2 are skipped.")
        return None
    if variant not in index.centroids:
        raise ValueError(f"unknown centroid variant {variant!r}; this index has {sorted(index.centroids)}")
    notes.append(f"Reference vectors: the index's {variant!r} centroids ({index.dim}-d).")
    return np.asarray(index.centroids[variant], dtype=np.float32)


def _frequencies(index: Any, source: str, catalogue: Any, split: Any, notes: list[str]) -> np.ndarray | None:
    if source not in FREQUENCY_SOURCES:
        raise ValueError(f"frequencies must be one of {FREQUENCY_SOURCES}, got {source!r}")
    if source == "auto":
        if split is not None or catalogue is not None:
            source = "targets"
        elif index.item_interactions is not None:
            source = "interactions"
        else:
            notes.append("No catalogue and no interaction counts in the index: popularity R^2 skipped.")
            return None
    if source == "none":
        notes.append("No code frequencies asked for: popularity R^2 skipped.")
        return None
    if source == "targets":
        if split is None:
            if catalogue is None:
                raise ValueError("frequencies='targets' needs a catalogue or its split")
            split = catalogue.leave_one_out()
        counts = split.training_target_counts()
        notes.append("Code frequency: how often each code is a training target (leave-one-out split).")
        return token_frequencies(index, "interactions", counts).astype(np.float64)
    if source == "interactions":
        notes.append("Code frequency: interactions with the items carrying each code (the index's counts).")
        return token_frequencies(index, "interactions").astype(np.float64)
    notes.append("Code frequency: items carrying each code.")
    return token_frequencies(index, "items").astype(np.float64)


def _categories(index: Any, catalogue: Any, depth: int, notes: list[str]) -> list[str | None] | None:
    if catalogue is not None:
        labels = majority_labels(index, 0, item_labels=catalogue.category_labels(depth))
        origin = "the catalogue"
    elif index.item_categories is not None:
        labels = majority_labels(index, 0, depth=depth)
        origin = "the categories stored in the index"
    else:
        notes.append("No catalogue and no categories in the index: neighbourhood purity is skipped.")
        return None
    level0 = [None if label in (None, MISSING_CATEGORY) else label for label, _ in labels]
    if sum(label is not None for label in level0) < 2:
        notes.append(
            f"{origin.capitalize()} gives no categories for the level-0 codes: neighbourhood purity is skipped."
        )
        return None
    notes.append(
        f"Categories: the majority level-0 label of each code's items (depth {depth}), from {origin}."
    )
    return level0 + [None] * (index.n_tokens - len(level0))


# How items spread over the SID codes: per-token frequencies and the majority label of each code, read from
# a :class:`~peft_grounded.sids.SIDIndex` (the geometry report's code frequencies and category purity).


def token_frequencies(
    index: SIDIndex, by: str = "items", counts: Mapping[str, int] | None = None
) -> np.ndarray:
    """Per SID token (row order): how many items carry it (``by="items"``), or how many interactions
    name an item carrying it (``by="interactions"``; ``counts`` maps item id -> count, e.g.
    ``split.training_target_counts()``, and defaults to the build catalogue's interactions)."""
    if by == "items":
        weights = np.ones(index.n_items)
    elif by == "interactions":
        if counts is not None:
            weights = np.array([counts.get(i, 0) for i in index.item_ids], dtype=np.float64)
        elif index.item_interactions is not None:
            weights = index.item_interactions.astype(np.float64)
        else:
            raise ValueError("this index has no interaction counts; pass counts={item_id: count}")
    else:
        raise ValueError(f"by must be 'items' or 'interactions', got {by!r}")
    out = np.concatenate(
        [
            np.bincount(index.codes[:, lv], weights=weights, minlength=k)
            for lv, k in enumerate(index.codes_per_level)
        ]
    )
    return out.astype(np.int64)


def majority_labels(
    index: SIDIndex,
    level: int = 0,
    item_labels: Mapping[str, str] | Sequence[str] | None = None,
    depth: int = 0,
) -> list[tuple[str | None, float]]:
    """For each code of ``level``: the most common label of its items and that label's share.

    ``item_labels`` (per item id, or in ``item_ids`` order) defaults to the category path element at
    ``depth`` stored at build time. Codes no item carries give ``(None, 0.0)``.
    """
    if item_labels is None:
        if index.item_categories is None:
            raise ValueError("this index stores no categories; pass item_labels")
        labels = [c[min(depth, len(c) - 1)] if c else "<none>" for c in index.item_categories]
    elif isinstance(item_labels, Mapping):
        labels = [item_labels.get(i, "<none>") for i in index.item_ids]
    else:
        labels = list(item_labels)
    per_code: list[Counter[str]] = [Counter() for _ in range(index.codes_per_level[level])]
    for code, label in zip(index.codes[:, level].tolist(), labels, strict=True):
        per_code[code][label] += 1
    out: list[tuple[str | None, float]] = []
    for counter in per_code:
        if counter:
            label, n = counter.most_common(1)[0]
            out.append((label, n / sum(counter.values())))
        else:
            out.append((None, 0.0))
    return out


def level0_labels(index: SIDIndex, depth: int = 0) -> list[str | None]:
    """Majority category label of each level-0 token (for neighbourhood-purity diagnostics)."""
    return [label for label, _ in majority_labels(index, 0, depth=depth)]
