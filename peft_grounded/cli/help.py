"""``--help`` of the stage commands without importing TRL or torch.

The flags of ``ground``, ``sft`` and ``evaluate`` come from dataclasses through TRL's parser (for the first
two, the fields of TRL's ``SFTConfig``), so their help can only be rendered by importing TRL, which takes
seconds. The rendered text is therefore kept, keyed by what it depends on: the Python minor version, the
versions of TRL, transformers and PEFT, and the source of the modules that declare the fields. It is
looked up

1. in the snapshot shipped with the package (``peft_grounded/cli/help/COMMAND.txt``), which a test holds
   against the installed libraries (``python -m peft_grounded.cli.help`` writes it anew);
2. in the user's cache (``~/.cache/peft_grounded/help/``, see :func:`peft_grounded.assets.cache_dir`);
3. else rendered (the slow path, once) and cached.
"""

from __future__ import annotations

import hashlib
import importlib
import sys
from importlib import metadata
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent
SNAPSHOTS = Path(__file__).resolve().parent / "help"
LIBRARIES = ("trl", "transformers", "peft")
# The modules that declare a settings command's flags (paths inside the package)
SOURCES = {
    "ground": ("cli/common.py", "cli/ground.py", "training/config.py", "grounding/trainer.py"),
    "sft": ("cli/common.py", "cli/sft.py", "training/config.py", "recommend/trainer.py"),
    "evaluate": ("cli/common.py", "cli/evaluate.py", "evaluation/settings.py"),
}
KEY_PREFIX = "# help key: "


def help_key(command: str) -> str:
    """What the help text of ``command`` depends on, hashed: Python, library versions, field sources."""
    digest = hashlib.sha256(f"python {sys.version_info[0]}.{sys.version_info[1]}\n".encode())
    for library in LIBRARIES:
        try:
            digest.update(f"{library} {metadata.version(library)}\n".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{library} missing\n".encode())
    for source in SOURCES[command]:
        digest.update((PACKAGE / source).read_bytes())
    return digest.hexdigest()[:16]


def render(command: str) -> str:
    """The help text as the command's parser prints it (imports TRL: seconds)."""
    return importlib.import_module(f"{__package__}.{command}").parser().format_help()


def _read(path: Path, key: str) -> str | None:
    try:
        first, _, text = path.read_text(encoding="utf-8").partition("\n")
    except OSError:
        return None
    return text if first == KEY_PREFIX + key else None


def _cache_file(command: str, key: str) -> Path:
    from ..assets import cache_dir

    return cache_dir() / "help" / f"{command}-{key}.txt"


def help_text(command: str) -> str:
    """The help text of ``command``: the shipped snapshot or the user's cache when they fit the installed
    libraries and sources, else rendered and cached."""
    key = help_key(command)
    for path in (SNAPSHOTS / f"{command}.txt", _cache_file(command, key)):
        text = _read(path, key)
        if text is not None:
            return text
    text = render(command)
    try:
        from .._io import atomic_write_text

        atomic_write_text(_cache_file(command, key), KEY_PREFIX + key + "\n" + text)
    except OSError:  # a read-only home: the help is still printed, only not kept
        pass
    return text


def write_snapshots() -> list[Path]:
    """Render every settings command's help and write the shipped snapshots (run after changing their fields
    or upgrading TRL, transformers or PEFT)."""
    from .._io import atomic_write_text

    written = []
    for command in SOURCES:
        path = SNAPSHOTS / f"{command}.txt"
        atomic_write_text(path, KEY_PREFIX + help_key(command) + "\n" + render(command))
        written.append(path)
    return written


if __name__ == "__main__":
    for written in write_snapshots():
        print(f"wrote {written}")
