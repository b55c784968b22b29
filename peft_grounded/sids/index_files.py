"""The SID index's files: ``sid_index.json`` and the content-named tensor file it names.

:func:`save_index` writes the tensor file first, under its new name, then the JSON replaces the old one (both
through temporary files and ``os.replace``), then tensor files that no index JSON in the folder names go: a
crash at any point leaves a loadable index. A folder can hold other index JSONs too (e.g. a copy
``sid_index.v1.json`` kept for the adapters trained on it): a tensor file any of them names stays.
:func:`read_index` checks the JSON, the tensor file's size and SHA-256, and returns the index's fields.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from .._io import atomic_write, read_json
from .behaviour import ItemVectorMap

FORMAT = "peft_grounded.sid_index"  # the "format" field of every index JSON
FORMAT_VERSION = 1
JSON_NAME = "sid_index.json"
TENSORS_NAME = "sid_index.safetensors"  # the name older saves used (still read: the JSON names the file)


TENSOR_FILE_PATTERN = re.compile(r"sid_index(\.[0-9a-f]{16})?\.safetensors")


def tensor_file_name(sha256: str) -> str:
    """The tensor file's name: content-addressed, so a new save never overwrites the one in use."""
    return f"sid_index.{sha256[:16]}.safetensors"


def tensors_path(directory: str | Path) -> Path:
    """The tensor file the index saved in ``directory`` uses (named in its ``sid_index.json``)."""
    directory = Path(directory)
    meta = read_json(directory / JSON_NAME, fix=REBUILD)
    record = meta.get("tensors") if isinstance(meta, dict) else None
    name = record.get("file") if isinstance(record, dict) else None
    if not isinstance(name, str) or not TENSOR_FILE_PATTERN.fullmatch(name):
        raise IndexFileError(
            f"{directory / JSON_NAME} names the tensor file {name!r}, not a content-named file"
        )
    return directory / name


CENTROID_VARIANTS = ("items", "codebook")
REBUILD = "rebuild it with `peft-grounded build-sids` (or restore a good copy)"

# sid_index.json fields: (type(s), required); older saves lack the optional ones
_META_FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {
    "version": ((int,), True),
    "item_ids": ((list,), True),
    "codes_per_level": ((list,), True),
    "disambiguation_level": ((bool,), True),
    "normalize_residuals": ((bool,), True),
    "token_template": ((str,), True),
    "centroid_variants": ((list,), True),
    "encoder": ((dict,), True),
    "text_template": ((dict, type(None)), True),
    "quality": ((dict,), True),
    "build_config": ((dict,), True),
    "quantizer": ((str,), False),
    "item_categories": ((list, type(None)), False),
    "parent": ((str, type(None)), False),
    "lineage": ((list, type(None)), False),
    "vector_map": ((dict, type(None)), False),
}


def _check_meta(meta: dict[str, Any], json_path: Path) -> None:
    """Raise :class:`IndexFileError` naming every field of ``sid_index.json`` that is missing or of the
    wrong type (a hand-edited or foreign file would otherwise fail deep inside the loader)."""
    problems = []
    for key, (types, required) in _META_FIELDS.items():
        if key not in meta:
            if required:
                problems.append(f"{key!r} is missing")
            continue
        value = meta[key]
        wrong_bool = isinstance(value, bool) and bool not in types  # JSON true is not a version number
        if not isinstance(value, types) or wrong_bool:
            wanted = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            problems.append(f"{key!r} must be {wanted}, got {value!r:.60}")
    if not problems:
        if not all(isinstance(i, str) for i in meta["item_ids"]):
            problems.append("'item_ids' must be a list of strings")
        if not all(
            isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in meta["codes_per_level"]
        ):
            problems.append(
                f"'codes_per_level' must be positive integers, got {meta['codes_per_level']!r:.60}"
            )
        unknown = [v for v in meta["centroid_variants"] if v not in CENTROID_VARIANTS]
        if unknown:
            problems.append(f"'centroid_variants' holds unknown variants {unknown!r:.60}")
        if meta.get("quantizer", "rqkmeans") not in ("rqkmeans", "rqvae"):
            problems.append(f"'quantizer' must be 'rqkmeans' or 'rqvae', got {meta['quantizer']!r:.60}")
        vector_map = meta.get("vector_map")
        if vector_map is not None and (
            vector_map.get("source") not in ("behaviour", "mix")
            or not isinstance(vector_map.get("behaviour_weight"), (int, float))
            or isinstance(vector_map.get("behaviour_weight"), bool)
        ):
            problems.append(
                "'vector_map' must hold 'source' ('behaviour' or 'mix') and a numeric 'behaviour_weight', "
                f"got {vector_map!r:.60}"
            )
    if problems:
        raise IndexFileError(
            f"{json_path}: " + "; ".join(problems) + f" (a damaged or foreign index); {REBUILD}"
        )


def _hub_cache_blobs(directory: Path) -> Path | None:
    """The ``blobs`` folder of the Hugging Face cache repo ``directory`` is a snapshot folder of, if it is one
    (the cache links ``snapshots/<commit>/...`` files to ``blobs/<hash>``)."""
    for parent in directory.resolve().parents:
        if parent.name == "snapshots":
            blobs = parent.parent / "blobs"
            return blobs.resolve() if blobs.is_dir() else None
    return None


def _own_file(path: Path, directory: Path) -> Path:
    """``path`` if it is a file of ``directory`` itself, not a link out of it (an index reads only its own
    files: a link could make it read, and checksum-accept, any file on the machine); the Hugging Face
    cache's links from a snapshot to its repo's blobs are its own files."""
    resolved = path.resolve()
    if resolved.parent not in (directory.resolve(), _hub_cache_blobs(directory)):
        raise IndexFileError(
            f"{path} is a link to {resolved}, outside the index folder {directory}; an index reads only its own "
            f"files: copy the file into the folder (replacing the link), or {REBUILD}"
        )
    return path


class IndexFileError(ValueError):
    """A SID index file that is missing, truncated, corrupted or of an unknown version."""


def _package_version() -> str:
    try:
        from importlib.metadata import version

        return version("peft-grounded")
    except Exception:  # pragma: no cover - not installed
        return "unknown"


def named_tensor_files(directory: str | Path) -> set[str]:
    """Names of the tensor files that the index JSONs in ``directory`` name (unreadable JSONs are skipped)."""
    names = set()
    for path in Path(directory).glob("*.json"):
        try:
            meta = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(meta, dict) and meta.get("format") == FORMAT:
            record = meta.get("tensors")
            if isinstance(record, dict) and isinstance(record.get("file"), str):
                names.add(Path(record["file"]).name)
    return names


def remove_unnamed_tensor_files(directory: str | Path) -> list[Path]:
    """Delete the ``sid_index*.safetensors`` files of ``directory`` that no index JSON there names."""
    keep = named_tensor_files(directory)
    removed = []
    for path in Path(directory).glob("sid_index*.safetensors"):
        if path.name not in keep:
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def save_index(index: Any, directory: str | Path) -> Path:
    """Write ``index`` into ``directory``: the tensor file, then ``sid_index.json``, both atomically; the folder
    is locked while it is written (a concurrent save there stops with an error)."""
    from .._io import output_lock

    with output_lock(directory, "SID index save"):
        return _save(index, Path(directory))


def _save(index: Any, directory: Path) -> Path:
    from safetensors.numpy import save

    directory.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, np.ndarray] = {"codes": index.codes.astype(np.int64)}
    for level, book in enumerate(index.codebooks):
        tensors[f"codebook.{level}"] = np.ascontiguousarray(book, dtype=np.float32)
    for variant, matrix in index.centroids.items():
        tensors[f"centroids.{variant}"] = np.ascontiguousarray(matrix, dtype=np.float32)
    if index.vector_map is not None:
        tensors |= index.vector_map.tensors()
    if index.item_interactions is not None:
        tensors["item_interactions"] = np.asarray(index.item_interactions, dtype=np.int64)
    # One metadata key: safetensors writes them from a hash map, in an order that changes from one save to the
    # next, and the file is named by its hash; the version is in sid_index.json.
    payload = save(tensors, metadata={"format": FORMAT})
    meta = {
        "format": FORMAT,
        "version": index.version,
        "package_version": _package_version(),
        "n_items": index.n_items,
        "codes_per_level": list(index.codes_per_level),
        "disambiguation_level": index.disambiguation_level,
        "normalize_residuals": index.normalize_residuals,
        "quantizer": index.quantizer,
        "token_template": index.token_template,
        "tokens": index.token_strings,
        "centroid_variants": sorted(index.centroids),
        "encoder": index.encoder,
        "text_template": index.text_template,
        "quality": index.quality,
        "build_config": index.build_config,
        "tensors": {
            "file": tensor_file_name(hashlib.sha256(payload).hexdigest()),
            "bytes": len(payload),
            "sha256": hashlib.sha256(payload).hexdigest(),
        },
        "item_ids": index.item_ids,
        "item_categories": None
        if index.item_categories is None
        else [list(c) for c in index.item_categories],
        "parent": index.parent,
        "lineage": list(index.lineage),
        "vector_map": None if index.vector_map is None else index.vector_map.record(),
    }
    # the tensor file is named by its content: writing it never touches the file the current JSON names,
    # so a crash at any point leaves a loadable index (the old one, or the new one)
    atomic_write(directory / meta["tensors"]["file"], payload)
    atomic_write(directory / JSON_NAME, json.dumps(meta, ensure_ascii=False).encode("utf-8"))
    remove_unnamed_tensor_files(directory)  # a file another index JSON there names stays
    for stale in directory.glob(".sid_index*.tmp"):  # a killed save's temporary files (the folder is locked)
        stale.unlink(missing_ok=True)
    return directory


def fields_source(path: str | Path) -> Path:
    """The ``sid_index.json`` that ``path`` (a folder or the JSON itself) names, for messages."""
    path = Path(path)
    return path if path.suffix == ".json" else path / JSON_NAME


def read_index(path: str | Path, verify: bool = True) -> dict[str, Any]:
    """The constructor arguments of the index saved at ``path`` (its directory or its ``sid_index.json``);
    the JSON's fields, the tensor file's size and SHA-256 checked, links out of the folder refused."""
    from safetensors import SafetensorError
    from safetensors.numpy import load

    path = Path(path)
    directory = path.parent if path.suffix == ".json" else path
    json_path = directory / JSON_NAME
    fix = REBUILD
    if not json_path.is_file():
        raise IndexFileError(f"no SID index at {directory} (missing {JSON_NAME}); {fix}")
    _own_file(json_path, directory)
    try:
        meta = read_json(json_path, fix=fix)
    except ValueError as err:
        raise IndexFileError(str(err)) from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise IndexFileError(f"{json_path} is not a peft_grounded SID index; {fix}")
    _check_meta(meta, json_path)
    if meta["version"] > FORMAT_VERSION:
        raise IndexFileError(
            f"{json_path} has format version {meta['version']}, newer than this peft_grounded reads "
            f"({FORMAT_VERSION}); upgrade peft_grounded"
        )
    record = meta.get("tensors")
    if not isinstance(record, dict) or not {"file", "bytes", "sha256"} <= set(record):
        raise IndexFileError(f"{json_path} lacks its tensor-file record (an incomplete index); {fix}")
    name = record["file"]
    if not isinstance(name, str) or not TENSOR_FILE_PATTERN.fullmatch(name):
        raise IndexFileError(
            f"{json_path} names the tensor file {name!r}, not a file of the index's own folder "
            "(sid_index.<16 hex digits>.safetensors): a foreign or tampered index; " + fix
        )
    tensor_path = directory / name
    if not tensor_path.is_file():
        raise IndexFileError(f"{tensor_path} is missing; {fix}")
    _own_file(tensor_path, directory)
    payload = tensor_path.read_bytes()
    if len(payload) != record["bytes"]:
        raise IndexFileError(
            f"{tensor_path} has {len(payload)} bytes, {record['bytes']} expected: truncated or from "
            f"another save; {fix}"
        )
    if verify and hashlib.sha256(payload).hexdigest() != record["sha256"]:
        raise IndexFileError(f"{tensor_path} fails its SHA-256 check: corrupted or from another save; {fix}")
    try:
        tensors = load(payload)
    except (SafetensorError, ValueError) as err:
        raise IndexFileError(f"{tensor_path} cannot be read ({err}); {fix}") from None
    n_books = len(meta["codes_per_level"]) - int(meta["disambiguation_level"])
    try:
        return dict(
            item_ids=list(meta["item_ids"]),
            codes=tensors["codes"],
            codes_per_level=tuple(meta["codes_per_level"]),
            codebooks=[tensors[f"codebook.{lv}"] for lv in range(n_books)],
            centroids={v: tensors[f"centroids.{v}"] for v in meta["centroid_variants"]},
            disambiguation_level=bool(meta["disambiguation_level"]),
            normalize_residuals=bool(meta["normalize_residuals"]),
            quantizer=meta.get("quantizer", "rqkmeans"),
            token_template=meta["token_template"],
            encoder=meta["encoder"],
            text_template=meta["text_template"],
            quality=meta["quality"],
            build_config=meta["build_config"],
            item_interactions=tensors.get("item_interactions"),
            item_categories=None
            if meta.get("item_categories") is None
            else [tuple(c) for c in meta["item_categories"]],
            version=int(meta["version"]),
            parent=meta.get("parent"),
            lineage=list(meta.get("lineage") or []),
            vector_map=None
            if meta.get("vector_map") is None
            else ItemVectorMap.from_files(meta["vector_map"], tensors),
        )
    except KeyError as err:
        raise IndexFileError(f"{directory} lacks {err} (an incomplete or foreign index); {fix}") from None
