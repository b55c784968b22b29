"""Checkpoints on disk: a grounded adapter's SID rows in the SID index's order, and a runner's output folder.

A checkpoint is a directory holding ``adapter_config.json`` + ``adapter_model.safetensors`` (what
``save_pretrained`` writes). Only the grounded rows are read (keys ending in ``grounded_embedding`` /
``grounded_head``); LoRA weights next to them are left alone.

The strategy runner (:mod:`peft_grounded.pipeline.runner`) writes, per strategy,
``<strategy>/{init,grounding,sft}/adapter``, ``run.json`` and ``metrics.json``; the demo puts its
strategies in ``<out>/strategies/<strategy>-seed<N>``. :func:`find_run_checkpoints` turns either
layout into checkpoints named ``<strategy>/<stage>``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..adapter.saved import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from ..training.runs import ADAPTER_DIR, RESULTS_FILE, STAGES
from ..training.runs import (
    MANIFEST as RUN_MANIFEST,  # the runner's manifest (strategy, budget, model, SID index)
)

# Report order: the baselines first, then the initialisations they are compared with.
STRATEGY_ORDER = ("mean", "gaussian", "random", "centroid", "gti", "centroid_gti")
MATRICES = ("input", "output")

_SEED_SUFFIX = re.compile(r"^(?P<name>.+)-seed(?P<seed>\d+)$")


@dataclass(frozen=True)
class Checkpoint:
    """A saved adapter to diagnose: its directory, its label in the report and its stage."""

    path: Path
    name: str
    stage: str = ""
    index_fingerprint: str | None = None  # the runner's fingerprint of the SID index it trained with


def _is_adapter(path: Path) -> bool:
    return (path / ADAPTER_CONFIG).is_file() and (path / ADAPTER_WEIGHTS).is_file()


def _run_manifest(strategy_dir: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((strategy_dir / RUN_MANIFEST).read_text())
    except (OSError, ValueError):  # bad JSON or bytes: no manifest to go by
        return {}
    return manifest if isinstance(manifest, dict) and "strategy" in manifest else {}


def checkpoint(path: str | os.PathLike[str], name: str | None = None, stage: str | None = None) -> Checkpoint:
    """A :class:`Checkpoint` for an adapter directory (a runner's stage directory also works).

    Default labels: ``<strategy>/<stage>`` for the runner's ``<strategy>/<stage>/adapter``, else the
    directory name; the stage is the runner's stage name when the path has one.
    """
    directory = Path(path)
    if not _is_adapter(directory) and _is_adapter(directory / ADAPTER_DIR):
        directory = directory / ADAPTER_DIR
    if not _is_adapter(directory):
        raise FileNotFoundError(
            f"no saved adapter at {directory} (expected {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS}); pass the "
            "directory that save_pretrained wrote, e.g. <run>/sft/adapter"
        )
    from_runner = directory.name == ADAPTER_DIR and directory.parent.name in STAGES
    fingerprint = None
    if from_runner:
        fingerprint = _run_manifest(directory.parent.parent).get("index")
        default_name = f"{directory.parent.parent.name}/{directory.parent.name}"
    else:
        default_name = directory.name if directory.name != ADAPTER_DIR else directory.parent.name
    default_stage = directory.parent.name if from_runner else ""
    return Checkpoint(
        directory,
        name or default_name,
        default_stage if stage is None else stage,
        fingerprint if isinstance(fingerprint, str) else None,
    )


# ----------------------------------------------------------------------------------------- SID rows


@dataclass
class AdapterRows:
    """The SID rows of one adapter, in the SID index's token order, and what its config says."""

    rows: Any  # torch.Tensor [n_tokens, width], float32
    base_model: str | None  # base_model_name_or_path from adapter_config.json
    original_vocab_size: int  # rows of the base vocabulary (ids below it)
    embedding_signature: list[float] | None
    init: str | None


def load_sid_rows(path: str | os.PathLike[str], tokens: list[str], matrix: str = "input") -> AdapterRows:
    """The rows of ``tokens`` (the SID index's ``token_strings``) in a saved grounded adapter.

    Rows are matched by token string, so they come back in ``tokens``' order whatever order the
    adapter stored them in. ``matrix="output"`` takes the untied head's rows (``grounded_head``); a
    tied adapter has one set of rows, which then serves both. Raises ``ValueError`` when the adapter
    holds other tokens than ``tokens`` (another SID index) or more or fewer of them.
    """
    from ..adapter.saved import read_adapter, recorded_fact

    if matrix not in MATRICES:
        raise ValueError(f"matrix must be one of {MATRICES}, got {matrix!r}")
    directory = checkpoint(path).path
    adapter = read_adapter(directory)
    config = adapter.config
    saved = adapter.token_strings
    if not saved:
        raise ValueError(
            f"{directory}/{ADAPTER_CONFIG} records no token_strings, so its rows cannot be matched to the "
            "SID index's tokens; create adapters with GroundedTokenConfig(token_indices=add_tokens(...))"
        )
    _check_same_tokens(directory, list(saved), tokens)
    stored = (
        adapter.output_rows if matrix == "output" and adapter.output_rows is not None else adapter.input_rows
    )
    order = adapter.positions(tokens)
    indices = [int(i) for i in config.get("token_indices") or []]
    original = config.get("original_vocab_size") or (min(indices) if indices else None)
    if original is None:
        raise ValueError(
            f"{directory}/{ADAPTER_CONFIG} records neither original_vocab_size nor token_indices"
        )
    return AdapterRows(
        rows=stored[order].float(),
        base_model=config.get("base_model_name_or_path") or None,
        original_vocab_size=int(original),
        embedding_signature=recorded_fact(config, "embedding_signature"),
        init=config.get("init"),
    )


def _check_same_tokens(directory: Path, saved: list[str], tokens: list[str]) -> None:
    if len(set(saved)) != len(saved):
        raise ValueError(f"{directory}/{ADAPTER_CONFIG} lists a token more than once")
    if set(saved) == set(tokens):
        return
    missing = [t for t in tokens if t not in set(saved)]
    extra = [t for t in saved if t not in set(tokens)]
    raise ValueError(
        f"the adapter at {directory} does not match the SID index: it has {len(saved)} new tokens, the "
        f"index {len(tokens)}"
        + (f"; missing from the adapter: {missing[:5]}" if missing else "")
        + (f"; not in the index: {extra[:5]}" if extra else "")
        + ". Diagnose a checkpoint with the SID index it was trained with."
    )


# --------------------------------------------------------------------------------- runner folders


@dataclass
class RunFolder:
    """The checkpoints found in a runner's output folder, and what was left out (one sentence each)."""

    checkpoints: list[Checkpoint]
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Strategy:
    directory: Path
    name: str  # the strategy's name, from its manifest or directory
    seed: int | None


def _strategy_dirs(root: Path) -> list[_Strategy]:
    def looks_like_run(d: Path) -> bool:
        return (d / RESULTS_FILE).is_file() or bool(_run_manifest(d)) or _is_adapter(d / "init" / ADAPTER_DIR)

    if not looks_like_run(root) and (root / "strategies").is_dir():  # the demo's output folder
        root = root / "strategies"
    candidates = [root] if looks_like_run(root) else sorted(d for d in root.iterdir() if d.is_dir())
    found = []
    for d in candidates:
        if not looks_like_run(d):
            continue
        manifest = _run_manifest(d)
        match = _SEED_SUFFIX.match(d.name)
        name = (manifest.get("strategy") or {}).get("name") or (match["name"] if match else d.name)
        seed = (manifest.get("budget") or {}).get("seed")
        if seed is None and match:
            seed = int(match["seed"])
        found.append(_Strategy(d, str(name), None if seed is None else int(seed)))
    return found


def _stage_dirs(strategy: _Strategy) -> list[tuple[str, Path]]:
    """(stage, adapter dir) in run order: the stages metrics.json lists, else the known stage folders."""
    recorded: dict[str, str] = {}
    try:
        recorded = json.loads((strategy.directory / RESULTS_FILE).read_text()).get("stages") or {}
    except (OSError, ValueError, AttributeError):
        recorded = {}
    names = set(recorded) or {s for s in STAGES if (strategy.directory / s).is_dir()}
    names = sorted(names, key=lambda s: (STAGES.index(s) if s in STAGES else len(STAGES), s))
    out = []
    for stage in names:
        local = strategy.directory / stage / ADAPTER_DIR  # the folder may have moved since the run
        elsewhere = (
            strategy.directory / recorded[stage] if stage in recorded else None
        )  # relative or absolute
        out.append((stage, local if local.exists() or elsewhere is None else elsewhere))
    return out


def find_run_checkpoints(
    runs_dir: str | os.PathLike[str],
    *,
    strategies: list[str] | None = None,
    stages: list[str] | None = None,
    seeds: str | list[int] = "first",
) -> RunFolder:
    """Every finished stage of every strategy in a runner's output folder, as checkpoints.

    ``runs_dir`` is one strategy's folder, a folder of them (``<name>`` or ``<name>-seed<N>``), or
    the demo's output folder (its ``strategies/``).
    Checkpoints are named ``<strategy>/<stage>`` (``<folder>/<stage>`` when several seeds are kept
    or two folders hold the same strategy), ordered baselines first (``STRATEGY_ORDER``) and by stage. ``seeds="first"`` keeps
    the lowest seed of each strategy, ``"all"`` every one, a list those seeds. Unfinished stages
    (no saved adapter yet) are left out with a note.
    """
    root = Path(runs_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"no runner output folder at {root}")
    found = _strategy_dirs(root)
    if not found:
        raise FileNotFoundError(
            f"{root} holds no strategy runs (folders with init/adapter, {RUN_MANIFEST} or {RESULTS_FILE}); "
            "pass the folder that run_strategy wrote into, or the folder holding several of them"
        )
    notes: list[str] = []
    if strategies is not None:
        unknown = sorted(set(strategies) - {s.name for s in found})
        if unknown:
            raise ValueError(
                f"no run of strategies {unknown} in {root}; found {sorted({s.name for s in found})}"
            )
        found = [s for s in found if s.name in strategies]
    all_seeds = sorted({s.seed for s in found if s.seed is not None})
    if seeds == "first" and len(all_seeds) > 1:
        keep = {
            s.name: min((t.seed for t in found if t.name == s.name and t.seed is not None), default=None)
            for s in found
        }
        left = sorted({s.seed for s in found if s.seed != keep[s.name] and s.seed is not None})
        found = [s for s in found if s.seed == keep[s.name]]
        notes.append(
            f"Seeds {left} left out: the report shows each strategy's lowest seed (seeds='all' keeps every one)."
        )
    elif isinstance(seeds, list):
        found = [s for s in found if s.seed in seeds]
        if not found:
            raise ValueError(f"no run with seeds {seeds} in {root}; found seeds {all_seeds}")
    elif seeds not in ("first", "all"):
        raise ValueError(f"seeds must be 'first', 'all' or a list of seeds, got {seeds!r}")
    several_seeds = len({s.seed for s in found}) > 1
    names = [s.name for s in found]

    def order(s: _Strategy) -> tuple[int, str, int]:
        rank = STRATEGY_ORDER.index(s.name) if s.name in STRATEGY_ORDER else len(STRATEGY_ORDER)
        return rank, s.name, -1 if s.seed is None else s.seed

    checkpoints = []
    for strategy in sorted(found, key=order):
        # the folder's name when the strategy's name alone is ambiguous (several seeds or copies)
        label = strategy.directory.name if several_seeds or names.count(strategy.name) > 1 else strategy.name
        for stage, directory in _stage_dirs(strategy):
            if stages is not None and stage not in stages:
                continue
            if not _is_adapter(directory):
                notes.append(f"{label}/{stage}: not finished (no saved adapter at {directory}), left out.")
                continue
            fingerprint = _run_manifest(strategy.directory).get("index")
            checkpoints.append(
                Checkpoint(
                    directory,
                    f"{label}/{stage}",
                    stage,
                    fingerprint if isinstance(fingerprint, str) else None,
                )
            )
    if not checkpoints:
        raise FileNotFoundError(
            f"no finished stage to diagnose in {root}" + (f" ({'; '.join(notes)})" if notes else "")
        )
    return RunFolder(checkpoints, notes)
