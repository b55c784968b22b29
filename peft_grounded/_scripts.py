"""``--dry-run`` for the benchmark scripts: parse, build the settings, stop before any work.

A script calls :func:`parse_script_args` instead of ``parser.parse_args``; its ``check`` builds what the run
would build from the arguments (configs, budgets) so that a bad setting fails in seconds, not after the long
work, and ``--dry-run`` stops there. The test of the documented commands (tests/test_documented_commands.py)
runs every ``python benchmarks/...`` command of the docs this way.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any


def parse_script_args(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None = None,
    check: Callable[[argparse.Namespace], Any] | None = None,
) -> argparse.Namespace:
    """``parser``'s arguments, with ``--dry-run`` added; ``check(args)`` runs first (it raises on bad settings).
    With ``--dry-run`` the settings are printed and the process exits with status 0."""
    parser.add_argument(
        "--dry-run", action="store_true", help="check the arguments and the settings they build, run nothing"
    )
    args = parser.parse_args(argv)
    built = check(args) if check is not None else None
    if args.dry_run:
        print(f"{parser.prog}: settings OK (--dry-run: nothing was run)")
        if built is not None:
            print(built)
        sys.exit(0)
    return args
