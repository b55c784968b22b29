"""What a command owns in a folder it writes: it replaces its own files and nothing else.

A folder a command did not create may hold the user's files (notes, a README, data); a command writes
or replaces only the files it owns there. Model cards are recognised by their front matter: TRL's carry
the ``generated_from_trainer`` tag, PEFT's ``library_name: peft``; a ``README.md`` without them is the
user's.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ._io import swap_dir_into_place

TRL_CARD_MARKER = "generated_from_trainer"  # a tag of every card TRL's trainers write
PEFT_CARD_MARKER = "library_name: peft"  # PEFT's save_pretrained card


def front_matter(path: Path, limit: int = 8192) -> str:
    """The YAML front matter (between the leading ``---`` lines) of a markdown file, or ''."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(limit)
    except OSError:
        return ""
    if not text.startswith("---"):
        return ""
    end = text.find("\n---", 3)
    return text[3:end] if end > 0 else ""


def is_generated_card(path: Path, marker: str) -> bool:
    """Whether the markdown file ``path`` is a model card a library generated (``marker`` in its front matter)."""
    return marker in front_matter(path)


RUN_MANIFEST = "run.json"  # a training run's (or a strategy run's) folder: see peft_grounded.training.runs


def check_report_folder(
    folder: Path,
    tool: str,
    files: Sequence[str],
    recognise: Callable[[Any], bool],
    flag: str = "--output_dir",
) -> None:
    """Refuse to write ``tool``'s ``files`` into ``folder`` unless it is new, or holds only other files, or
    holds ``tool``'s own earlier output (its ``files[0]``, a JSON file, passes ``recognise``).

    A training run's folder (``run.json``) is always refused: its ``metrics.json`` and curves are the
    run's record, and a strategy run refuses to resume once another tool replaced them."""
    if not folder.exists():
        return
    if not folder.is_dir():
        raise ValueError(f"{flag} {folder} is a file, not a folder; choose another {flag}")
    fix = f"choose another {flag} (e.g. a new folder inside it); nothing was written"
    if (folder / RUN_MANIFEST).is_file():
        raise ValueError(
            f"{folder} is a training run's folder (it holds {RUN_MANIFEST}): {tool} would replace the run's "
            f"own {', '.join(n for n in files if (folder / n).exists()) or 'files'}; {fix}"
        )
    first = folder / files[0]
    if first.exists():
        try:
            ours = recognise(json.loads(first.read_text(encoding="utf-8")))
        except (json.JSONDecodeError, UnicodeDecodeError, OSError):
            ours = False
        if not ours:
            raise ValueError(f"{first} was not written by {tool}, which would replace it; {fix}")
        return
    clashing = [name for name in files[1:] if (folder / name).exists()]
    if clashing:
        raise ValueError(
            f"{folder} holds {', '.join(clashing)}, not written by {tool} (no {files[0]} of its own next to "
            f"them), which it would replace; {fix}"
        )


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)  # same filesystem: no data copied, the user's file stays the same inode
    except OSError:
        shutil.copy2(source, target)


def _carry(entry: Path, target: Path) -> None:
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.is_dir():
        shutil.rmtree(target)
    if entry.is_symlink():
        os.symlink(os.readlink(entry), target)
    elif entry.is_dir():
        shutil.copytree(entry, target, symlinks=True, copy_function=_link_or_copy)
    else:
        _link_or_copy(str(entry), str(target))


def replace_keeping_others(new: Path, folder: Path, owned: Callable[[Path], bool]) -> list[str]:
    """Put the finished folder ``new`` in place of ``folder`` in one rename, carrying over every entry of
    ``folder`` that ``owned`` does not claim (hard links, else copies; the user's version wins over a file
    of the same name in ``new``). Returns the names carried over."""
    kept = []
    if folder.is_dir():
        for entry in sorted(folder.iterdir()):
            if not owned(entry):
                _carry(entry, new / entry.name)
                kept.append(entry.name)
    swap_dir_into_place(new, folder)
    return kept
