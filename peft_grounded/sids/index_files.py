"""Which ``sid_index*.safetensors`` files in a folder are still in use, and removing the others.

A SID index is ``sid_index.json`` plus the content-named tensor file it names. A folder can hold other
index JSONs too (e.g. a copy ``sid_index.v1.json`` kept for the adapters trained on it): a tensor file any
of them names stays; only files that no index JSON names are removed.
"""

from __future__ import annotations

import json
from pathlib import Path

FORMAT = "peft_grounded.sid_index"  # the "format" field of every index JSON


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
