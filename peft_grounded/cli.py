"""The ``peft-grounded`` command line.

Each pipeline stage owns its sub-commands in a ``cli.py`` next to its code, exposing
``add_cli(subparsers)``; keep those modules light (import heavy libraries inside the handlers).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

# Modules that contribute sub-commands, in pipeline order.
COMMAND_MODULES = (
    "peft_grounded.sids.cli",
    "peft_grounded.grounding.grow_cli",
    "peft_grounded.grounding.cli",
    "peft_grounded.recommend.cli",
    "peft_grounded.evaluation.cli",
    "peft_grounded.diagnostics.cli",
    "peft_grounded.hub.cli",
    "peft_grounded.pipeline.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="peft-grounded",
        description="Semantic-ID vocabularies for LMs: build SIDs, initialise and ground the new tokens, "
        "train the recommender, decode, evaluate and diagnose.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:  # a stage not written yet
            if err.name != name:
                raise
            continue
        module.add_cli(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run a command; a user's error (bad input, a file, the Hub: see :mod:`.cli_errors`) prints
    ``error: ...`` and returns 2, Ctrl-C prints what was kept and returns 130.

    Set ``PEFT_GROUNDED_DEBUG=1`` to see the traceback instead.
    """
    from .cli_errors import EXIT_INTERRUPTED, EXIT_USAGE, describe

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        if os.environ.get("PEFT_GROUNDED_DEBUG"):
            raise
        print(
            f"interrupted: {args.command} stopped before it finished (Ctrl-C). Its outputs are written "
            "through temporary files and renamed only when complete, so none is half-written: run the command "
            "again (training: --resume continues from the last checkpoint)",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    except Exception as err:
        message = describe(err)
        if message is None or os.environ.get("PEFT_GROUNDED_DEBUG"):
            raise
        print(f"error: {message}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
