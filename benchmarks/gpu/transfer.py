"""Split a file into parts that fit the device's 64 MiB per command, and put it back together, verified.

The SmolLM2-135M GGUF (98,362,432 bytes) is larger than one command may send: :func:`split_file` cuts it
into a first part sent by a short preparatory command and a second part sent with the run; the manifest
records each part's and the whole file's sha256, and :func:`reassemble` refuses anything that does not
match it (a missing, truncated or stale part).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

CHUNK = 1 << 20
MANIFEST = "manifest.json"


class TransferError(RuntimeError):
    """A part is missing, has the wrong size or hash, or the reassembled file does not match."""


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def split_file(source: str | Path, part_dirs: list[str | Path], first_bytes: list[int]) -> dict:
    """Cut ``source`` into ``len(part_dirs)`` parts: part ``i`` (``i < n-1``) holds ``first_bytes[i]`` bytes,
    the last one the rest. Each part is written as ``<part_dir>/<name>.part<i>``; returns the manifest
    (also the caller's to store next to the last part)."""
    source = Path(source)
    size = source.stat().st_size
    if len(first_bytes) != len(part_dirs) - 1:
        raise ValueError(f"{len(part_dirs)} parts need {len(part_dirs) - 1} sizes, got {len(first_bytes)}")
    if any(b <= 0 for b in first_bytes) or sum(first_bytes) >= size:
        raise ValueError(f"part sizes {first_bytes} do not leave a non-empty last part of {size} bytes")
    sizes = [*first_bytes, size - sum(first_bytes)]
    parts = []
    with open(source, "rb") as f:
        for i, (directory, n) in enumerate(zip(part_dirs, sizes, strict=True)):
            directory = Path(directory)
            directory.mkdir(parents=True, exist_ok=True)
            target = directory / f"{source.name}.part{i}"
            digest = hashlib.sha256()
            with open(target, "wb") as out:
                left = n
                while left:
                    chunk = f.read(min(CHUNK, left))
                    if not chunk:
                        raise TransferError(f"{source} ended early while writing {target}")
                    out.write(chunk)
                    digest.update(chunk)
                    left -= len(chunk)
            parts.append({"name": target.name, "bytes": n, "sha256": digest.hexdigest()})
    return {"name": source.name, "bytes": size, "sha256": sha256_file(source), "parts": parts}


def write_manifest(manifest: dict, directory: str | Path) -> Path:
    path = Path(directory) / MANIFEST
    path.write_text(json.dumps(manifest, indent=2) + "\n")
    return path


def find_part(name: str, search: list[str | Path]) -> Path:
    """The first ``<dir>/<name>`` among ``search`` (the carried folder, then the copy a previous command kept)."""
    for directory in search:
        candidate = Path(directory) / name
        if candidate.is_file():
            return candidate
    raise TransferError(
        f"part {name} is in none of {[str(s) for s in search]}: run the preparatory command first "
        "(benchmarks/gpu/README.md), within the machine's warm period"
    )


def reassemble(manifest: dict, search: list[str | Path], target: str | Path) -> Path:
    """Write the file ``manifest`` describes to ``target`` from its parts (found under ``search``), checking
    each part's size and sha256 and the whole file's; an existing ``target`` with the right hash is kept."""
    target = Path(target)
    if (
        target.is_file()
        and target.stat().st_size == manifest["bytes"]
        and sha256_file(target) == manifest["sha256"]
    ):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp{os.getpid()}")
    whole = hashlib.sha256()
    try:
        with open(tmp, "wb") as out:
            for part in manifest["parts"]:
                path = find_part(part["name"], search)
                if path.stat().st_size != part["bytes"]:
                    raise TransferError(
                        f"{path}: {path.stat().st_size} bytes, the manifest says {part['bytes']}"
                    )
                digest = hashlib.sha256()
                with open(path, "rb") as f:
                    while chunk := f.read(CHUNK):
                        digest.update(chunk)
                        whole.update(chunk)
                        out.write(chunk)
                if digest.hexdigest() != part["sha256"]:
                    raise TransferError(f"{path}: sha256 {digest.hexdigest()} != manifest {part['sha256']}")
        if whole.hexdigest() != manifest["sha256"]:
            raise TransferError(
                f"reassembled {manifest['name']}: sha256 {whole.hexdigest()} != {manifest['sha256']}"
            )
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target
