"""Run manifests: what a training run is, so that a resume never continues another run's checkpoints.

A manifest (``run.json`` in the output directory) records the facts that define a run: the stage, the
model, the new tokens and their initialisation, the data and the hyper-parameters that shape the
optimisation. Starting a run in a directory that holds another run's checkpoints, or resuming from a
checkpoint whose manifest differs, raises an error that names the differing fields; nothing on disk is
touched before that check.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from .._io import atomic_write_text, read_json

# The layout of a run's folder (every stage and tool names its files from here)
MANIFEST = "run.json"  # what the run is (checked on resume)
ADAPTER_DIR = "adapter"  # a stage's final adapter
LOG_FILE = "log_history.json"  # a stage's loss log
RESULTS_FILE = "metrics.json"  # the strategy runner's results
CURVE_FILE = "curve.json"  # the strategy runner's learning curves per stage
STAGES = ("init", "grounding", "sft")  # the strategy runner's stage folders, in order
TRAINER_STATE = "trainer_state.json"  # written last by transformers into a checkpoint
# what a checkpoint holds its weights in (PEFT adapters, full models)
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin", "model.safetensors", "pytorch_model.bin")


class RunMismatchError(ValueError):
    """The checkpoints on disk belong to another run or configuration."""


def fingerprint(value: Any) -> str:
    """Short sha256 of a JSON-serialisable value (key order does not matter)."""
    text = json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def write_json_atomic(path: str | Path, value: Any) -> None:
    """Write JSON to ``path`` through a temporary file in the same directory (never a half-written file)."""
    atomic_write_text(path, json.dumps(value, indent=2, sort_keys=True, default=str) + "\n")


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: value}


def _differences(old: dict, new: dict) -> list[str]:
    """``key: old -> new`` for every (nested) field that differs, comparing values as stored in JSON."""
    old, new = _flatten(old), _flatten(json.loads(json.dumps(new, default=str)))
    keys = sorted(set(old) | set(new))
    return [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in keys if old.get(k) != new.get(k)]


def checkpoints(output_dir: str | Path) -> list[Path]:
    """The ``checkpoint-N`` directories of ``output_dir``, oldest first."""
    directory = Path(output_dir)
    found = [p for p in directory.glob("checkpoint-*") if p.is_dir() and p.name.split("-")[-1].isdigit()]
    return sorted(found, key=lambda p: int(p.name.split("-")[-1]))


def checkpoint_problem(checkpoint: str | Path) -> str | None:
    """Why ``checkpoint`` cannot be resumed from (a kill or a full disk during its write), or None.

    A complete checkpoint holds its weights, a readable ``trainer_state.json`` and the run manifest."""
    checkpoint = Path(checkpoint)
    if not any((checkpoint / name).is_file() for name in WEIGHT_FILES):
        return "no weights file"
    state = checkpoint / TRAINER_STATE
    if not state.is_file():
        return f"no {TRAINER_STATE}"
    try:
        json.loads(state.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, OSError):
        return f"a truncated {TRAINER_STATE}"
    if not (checkpoint / MANIFEST).is_file():
        return f"no {MANIFEST}"
    return None


def last_complete_checkpoint(output_dir: str | Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest checkpoint of ``output_dir`` that can be resumed from, and the newer, incomplete ones
    (each with what it lacks), which ``transformers`` would otherwise pick."""
    incomplete = []
    for checkpoint in reversed(checkpoints(output_dir)):
        problem = checkpoint_problem(checkpoint)
        if problem is None:
            return checkpoint, incomplete
        incomplete.append((checkpoint, problem))
    return None, incomplete


def check_manifest(source: Path, manifest: dict) -> None:
    """Raise :class:`RunMismatchError` unless the manifest file ``source`` records ``manifest``."""
    if not source.is_file():
        raise RunMismatchError(
            f"{source.parent} holds checkpoints without a {MANIFEST}: they were not written by this run. "
            "Choose an empty output directory."
        )
    recorded = read_json(source, fix="move the folder away and start the run in a new output directory")
    diff = _differences(recorded, manifest) if isinstance(recorded, dict) else ["(not a run manifest)"]
    if diff:
        raise RunMismatchError(
            f"{source.parent} belongs to another run or configuration; differing fields: "
            + "; ".join(diff)
            + ". Resume with the same settings, or start the new run in another output directory "
            "(the existing checkpoints were left untouched)."
        )


def check_and_write(output_dir: str | Path, manifest: dict, resume_from: str | Path | None) -> None:
    """Refuse to mix runs, then record ``manifest`` in ``output_dir`` (and nothing else)."""
    check_run(output_dir, manifest, resume_from)
    write_json_atomic(Path(output_dir) / MANIFEST, manifest)


def check_run(output_dir: str | Path, manifest: dict, resume_from: str | Path | None) -> None:
    """Raise :class:`RunMismatchError` if ``output_dir`` or ``resume_from`` holds another run; reads only.

    Distributed trainers call it on every rank (only the main one writes), so that a refusal stops every
    process instead of leaving the others waiting in a collective.
    """
    output_dir = Path(output_dir)
    sources = []
    if resume_from is not None:
        sources.append(Path(resume_from) / MANIFEST)
    if checkpoints(output_dir):
        sources.append(output_dir / MANIFEST)
    for source in sources:
        check_manifest(source, manifest)


def sample_rows(dataset, n: int | None, seed: int):
    """A seeded sample of ``n`` rows (all rows when ``n`` is None or larger than the dataset)."""
    from .config import check_max_examples

    check_max_examples(n)
    if n is None or n >= len(dataset):
        return dataset
    return dataset.shuffle(seed=seed).select(range(n))


def dataset_fingerprint(dataset) -> str:
    """A content hash of the rows, the same in every process and ``datasets`` version (large datasets fall
    back to ``datasets``' own fingerprint)."""
    if dataset is None:
        return "none"
    if len(dataset) <= 200_000:
        return fingerprint(dataset.to_list())
    return str(getattr(dataset, "_fingerprint", len(dataset)))
