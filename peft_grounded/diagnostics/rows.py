"""The rows a diagnosis reads: a grounded adapter's SID rows from checkpoints on disk, a runner's folders, and
the base model's vocabulary rows and token strings (:class:`Vocabulary`, below).

Checkpoints on disk: a grounded adapter's SID rows in the SID index's order, and a runner's output folder.

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

from huggingface_hub.constants import SAFETENSORS_INDEX_FILE as SAFETENSORS_INDEX
from huggingface_hub.constants import SAFETENSORS_SINGLE_FILE as SAFETENSORS

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


# The base model's vocabulary rows and token strings: the text tokens of the heatmap and the nearest-token table.
#
# From a local checkpoint, only the embedding (or head) tensor is read, and only its first ``n_rows``
# rows, through a safetensors slice, instead of building the whole model. Other checkpoints (``.bin`` files,
# Hub ids in the local cache) go through ``transformers``, and a model object in memory is used as it is.

# Tensor names of the input embedding and the output head in common architectures (suffixes).
INPUT_KEYS = (
    "embed_tokens.weight",
    "wte.weight",
    "word_embeddings.weight",
    "embed_in.weight",
    "tok_embeddings.weight",
)
OUTPUT_KEYS = ("lm_head.weight", "embed_out.weight", "output.weight")


@dataclass
class Vocabulary:
    """Rows ``0 .. n-1`` of a base model's input embedding (or head), with their token strings."""

    rows: Any  # torch.Tensor [n, width], float32
    tokens: list[str] | None  # tokenizer.convert_ids_to_tokens(range(n)); None without a tokenizer
    special_ids: list[int]  # kept out of the nearest-token search and the heatmap sample
    source: str  # where the rows came from, for the report
    notes: list[str] = field(default_factory=list)

    @property
    def size(self) -> int:
        return int(self.rows.shape[0])


def _find_key(keys: list[str], suffixes: tuple[str, ...]) -> str | None:
    for suffix in suffixes:
        matches = sorted(k for k in keys if k == suffix or k.endswith("." + suffix))
        if matches:
            return min(matches, key=len)
    return None


def _safetensors_rows(directory: Path, matrix: str, n_rows: int | None) -> tuple[Any, str] | None:
    """``(rows, tensor name)`` read straight from a local safetensors checkpoint, or None if it has none."""
    from safetensors import safe_open

    if (directory / SAFETENSORS_INDEX).is_file():
        from .._io import read_json

        weight_map: dict[str, str] = read_json(directory / SAFETENSORS_INDEX)["weight_map"]
    elif (directory / SAFETENSORS).is_file():
        with safe_open(str(directory / SAFETENSORS), framework="pt") as handle:
            weight_map = dict.fromkeys(handle.keys(), SAFETENSORS)
    else:
        return None
    keys = list(weight_map)
    key = _find_key(keys, OUTPUT_KEYS) if matrix == "output" else None
    key = key or _find_key(keys, INPUT_KEYS)  # a tied head has no tensor of its own
    if key is None:
        return None
    with safe_open(str(directory / weight_map[key]), framework="pt") as handle:
        part = handle.get_slice(key)
        total = part.get_shape()[0]
        rows = part[: total if n_rows is None else min(n_rows, total)]
    return rows.float(), key


def _module_rows(model: Any, matrix: str) -> Any:
    layer = model.get_output_embeddings() if matrix == "output" else None
    layer = layer if layer is not None else model.get_input_embeddings()
    base = layer.get_base_layer() if hasattr(layer, "get_base_layer") else layer  # a PEFT-wrapped layer
    return base.weight.detach()


def load_vocabulary(
    base_model: Any,
    n_rows: int | None = None,
    *,
    matrix: str = "input",
    tokenizer: Any = None,
) -> Vocabulary:
    """The first ``n_rows`` rows (default: all) of a base model's input embedding (``matrix="output"``:
    its head), as float32, and their token strings.

    ``base_model``: a local checkpoint directory, a Hub id in the local cache, or a model object
    (a PEFT-wrapped one too: its frozen base rows are used). ``tokenizer`` (default: the checkpoint's
    own, when it has one) decodes the ids and names the special tokens.
    """
    if matrix not in ("input", "output"):
        raise ValueError(f"matrix must be 'input' or 'output', got {matrix!r}")
    notes: list[str] = []
    path: Path | None = None
    if isinstance(base_model, (str, os.PathLike)):
        path = Path(base_model)
        found = _safetensors_rows(path, matrix, n_rows) if path.is_dir() else None
        if found is not None:
            rows, key = found
            source = f"{path} ({key})"
        else:
            rows, source = _transformers_rows(str(base_model), matrix), f"{base_model} (transformers)"
    else:
        rows = _module_rows(base_model, matrix).float()
        source = f"model object {type(base_model).__name__}"
        origin = getattr(base_model, "name_or_path", None)  # its tokenizer may sit next to its weights
        path = Path(origin) if origin and Path(origin).is_dir() else None
    if n_rows is not None:
        if rows.shape[0] < n_rows:
            raise ValueError(
                f"the base model {source} has {rows.shape[0]} vocabulary rows but the adapter extends a "
                f"vocabulary of {n_rows}: not the adapter's base model"
            )
        rows = rows[:n_rows]
    tokens, special = _token_strings(tokenizer, path, rows.shape[0], notes)
    return Vocabulary(rows.contiguous(), tokens, special, source, notes)


def _transformers_rows(name: str, matrix: str) -> Any:
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(name, use_safetensors=True)
    except (OSError, ValueError) as err:
        raise FileNotFoundError(
            f"cannot load the base model {name!r} ({err}); pass base_model= (--model_name_or_path) with a "
            "local checkpoint directory"
        ) from None
    return _module_rows(model, matrix).float()


def _token_strings(
    tokenizer: Any, path: Path | None, n: int, notes: list[str]
) -> tuple[list[str] | None, list[int]]:
    if tokenizer is None and path is not None:
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(str(path))
        except (OSError, ValueError) as err:
            notes.append(f"no tokenizer at {path} ({type(err).__name__}): vocabulary tokens are shown as ids")
    if tokenizer is None:
        return None, []
    decoded = tokenizer.convert_ids_to_tokens(list(range(min(n, len(tokenizer)))))
    tokens = [f"#{i}" if t is None else str(t) for i, t in enumerate(decoded)]
    tokens += [f"#{i}" for i in range(len(tokens), n)]  # rows past the tokenizer (Qwen3 padding rows)
    special = sorted({int(i) for i in tokenizer.all_special_ids if 0 <= int(i) < n})
    return tokens, special
