"""The ``peft-grounded`` command line.

Every command is a :class:`~.common.Command`: settings dataclasses parsed by TRL's parser (every field a flag
under its own name, ``--config FILE.yaml`` for any of them, ``--dry-run`` to check them and stop) and the
function that runs on them. :data:`COMMANDS` names each one's module and attribute; registering a command is
one line there. Command modules stay light (heavy libraries are imported inside
``run`` or inside ``settings`` where a TRL ``SFTConfig`` is needed), so ``--help`` is fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

# name -> "module:attribute" of its Command, in pipeline order
COMMANDS = {
    "build-sids": "peft_grounded.cli.sids:COMMAND",
    "add-items": "peft_grounded.cli.growth:ADD_ITEMS",
    "grow-adapter": "peft_grounded.cli.growth:GROW_ADAPTER",
    "ground": "peft_grounded.cli.ground:COMMAND",
    "sft": "peft_grounded.cli.sft:COMMAND",
    "fuse-peer": "peft_grounded.cli.evaluate:FUSE_PEER",
    "evaluate": "peft_grounded.cli.evaluate:COMMAND",
    "recommend": "peft_grounded.cli.recommend:COMMAND",
    "diagnose": "peft_grounded.cli.diagnose:COMMAND",
    "push": "peft_grounded.cli.hub:PUSH",
    "pull": "peft_grounded.cli.hub:PULL",
    "demo": "peft_grounded.cli.demo:COMMAND",
}


def command(name: str) -> Any:
    """The :class:`~.common.Command` registered as ``name``."""
    module, _, attribute = COMMANDS[name].partition(":")
    return getattr(importlib.import_module(module), attribute)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser: the list of commands (each command parses its own flags)."""
    parser = argparse.ArgumentParser(
        prog="peft-grounded",
        description="Semantic-ID vocabularies for LMs: build SIDs, initialise and ground the new tokens, "
        "train the recommender, decode, evaluate and diagnose.",
        epilog="peft-grounded COMMAND --help lists a command's flags.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        subparsers.add_parser(name, help=command(name).help, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run a command; a user's error (bad input, a file, the Hub: see :mod:`.common`) prints ``error: ...`` and
    returns 2, Ctrl-C prints what was kept and returns 130.

    Set ``PEFT_GROUNDED_DEBUG=1`` to see the traceback instead.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        build_parser().parse_args(argv)  # --help, or an error naming the commands
        return 2  # pragma: no cover - parse_args exits
    name = argv[0]
    from ..checks import EXIT_INTERRUPTED, EXIT_USAGE, describe

    try:
        return command(name).main(argv[1:])
    except KeyboardInterrupt:
        if os.environ.get("PEFT_GROUNDED_DEBUG"):
            raise
        print(
            f"interrupted: {name} stopped before it finished (Ctrl-C). Its outputs are written "
            "through temporary files and renamed only when complete, so none is half-written: run the command "
            "again (training: --resume_from_checkpoint continues from the last checkpoint)",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    except Exception as err:
        message = describe(err)
        if message is None or os.environ.get("PEFT_GROUNDED_DEBUG"):
            raise
        print(f"error: {message}", file=sys.stderr)
        return EXIT_USAGE


def run() -> None:
    """The ``peft-grounded`` console command: :func:`main`, then exit with its code.

    After Ctrl-C the process leaves through ``os._exit(130)`` once its streams and logs are flushed. Seen once
    in CI: a run that printed its "interrupted" line and returned 130 still died by SIGINT (status -2), which
    CPython does at exit when it recorded the KeyboardInterrupt as unhandled in an inner evaluation, depending
    on where the signal landed. By then the outputs are complete or absent (atomic writes; ``finally`` blocks
    have run).
    """
    from ..checks import EXIT_INTERRUPTED

    code = main()
    if code == EXIT_INTERRUPTED:
        import logging

        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    run()
