"""The ``peft-grounded`` command line.

One module per command group (``cli/sids.py``, ``cli/ground.py``, ...), each exposing ``add_cli(subparsers)``;
a command translates its arguments into the stage's settings and calls the stage. Keep these modules light
(import heavy libraries inside the handlers): ``--help`` must not import torch.

The stage commands (``ground``, ``sft``, ``evaluate``) are parsed by TRL's parser from their settings dataclasses (see
:mod:`.common`), every field a flag under its own name, ``--config FILE.yaml`` for any of them; their
``--help`` comes from :mod:`.help`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from functools import partial

# Modules that contribute sub-commands, in pipeline order.
COMMAND_MODULES = (
    "peft_grounded.cli.sids",
    "peft_grounded.cli.growth",
    "peft_grounded.cli.ground",
    "peft_grounded.cli.sft",
    "peft_grounded.cli.evaluate",
    "peft_grounded.cli.recommend",
    "peft_grounded.cli.diagnose",
    "peft_grounded.cli.hub",
    "peft_grounded.cli.demo",
)
# Commands parsed by TRL's parser from their settings dataclasses: name -> module
SETTINGS_COMMANDS = {
    "ground": "peft_grounded.cli.ground",
    "sft": "peft_grounded.cli.sft",
    "evaluate": "peft_grounded.cli.evaluate",
    "recommend": "peft_grounded.cli.recommend",
}


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
    """Run a command; a user's error (bad input, a file, the Hub: see :mod:`.errors`) prints ``error: ...`` and
    returns 2, Ctrl-C prints what was kept and returns 130.

    Set ``PEFT_GROUNDED_DEBUG=1`` to see the traceback instead.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    command: Callable[[], int | None]
    if argv and argv[0] in SETTINGS_COMMANDS:
        if {"-h", "--help"} & set(argv[1:]):
            from .help import SOURCES, help_text

            if argv[0] in SOURCES:  # a command without a help snapshot: its parser prints it below
                print(help_text(argv[0]), end="")
                return 0
        name = argv[0]
        module = importlib.import_module(SETTINGS_COMMANDS[name])
        command = partial(module.main, argv[1:])
    else:
        args = build_parser().parse_args(argv)
        name = args.command
        command = partial(args.func, args)
    from .errors import EXIT_INTERRUPTED, EXIT_USAGE, describe

    try:
        return int(command() or 0)
    except KeyboardInterrupt:
        if os.environ.get("PEFT_GROUNDED_DEBUG"):
            raise
        print(
            f"interrupted: {name} stopped before it finished (Ctrl-C). Its outputs are written "
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


def run() -> None:
    """The ``peft-grounded`` console command: :func:`main`, then exit with its code.

    After Ctrl-C the process leaves through ``os._exit(130)`` once its streams and logs are flushed. Seen once
    in CI: a run that printed its "interrupted" line and returned 130 still died by SIGINT (status -2), which
    CPython does at exit when it recorded the KeyboardInterrupt as unhandled in an inner evaluation, depending
    on where the signal landed. By then the outputs are complete or absent (atomic writes; ``finally`` blocks
    have run).
    """
    from .errors import EXIT_INTERRUPTED

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
