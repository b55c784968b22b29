"""The benchmark scripts' settings: dataclasses, parsed as the package's commands parse theirs, and ``--dry-run``.

A script declares each setting once, as a dataclass field with ``metadata={"help": ...}`` (reusing the package's
dataclasses where it exposes the same setting), and calls :func:`parse`, which parses them with TRL's parser
through the package's :class:`~peft_grounded.cli.common.Command`: one flag per field (``--foo_bar`` and
``--foo-bar``), ``--config FILE.yaml`` for any of them, positional fields as the command's ``positionals``.
``check`` builds what the run would build from the settings (configs, budgets), so that a bad setting fails in
seconds, not after the long work, and ``--dry-run`` stops there: the test of the documented commands
(tests/test_documented_commands.py) runs every ``python benchmarks/...`` command of the docs this way.

A script imports this module as ``benchmarks._args`` (tests, or the repository root on ``sys.path``) or, run
as a file (``python benchmarks/NAME.py``: its folder on ``sys.path``), as ``_args``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from peft_grounded.cli.common import Command

DRY_RUN = ("--dry-run", "--dry_run")


class OnOff(argparse.BooleanOptionalAction):
    """``--flag`` / ``--no-flag`` of a ``bool | None`` field whose None leaves the choice to the script:
    ``metadata={"action": OnOff}``."""

    def __init__(self, option_strings, dest, type=None, **kwargs):  # the parser passes a bool field's type
        super().__init__(option_strings, dest, **kwargs)


class ZeroOrMore(argparse.Action):
    """A list field whose flag may come alone (``--peers`` alone: an empty list, not the default):
    ``metadata={"action": ZeroOrMore}``."""

    def __init__(self, option_strings, dest, nargs=None, **kwargs):
        super().__init__(option_strings, dest, nargs="*", **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, list(values))


# a list field whose flag may be repeated (--run A --run B, as argparse's action="append"): metadata | REPEATABLE
REPEATABLE = {"action": "extend"}


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The script's docstring as written (its example commands keep their lines), the defaults shown."""


@dataclass(frozen=True)
class Script(Command):
    """A benchmark script as a package command: its file name as the program, its docstring as written."""

    def parser(self) -> Any:
        parser = super().parser()
        parser.prog = self.name
        parser.formatter_class = _Formatter
        return parser


def _no_run(*settings: Any) -> None:
    raise RuntimeError("a benchmark script runs its own main(), not the command's run")


def parse(
    settings: type | tuple[type, ...],
    argv: Sequence[str] | None = None,
    *,
    prog: str,
    description: str | None = None,
    check: Callable[..., Any] | None = None,
    positionals: tuple[tuple[str, str], ...] = (),
    defaults: dict[str, Any] | None = None,
    config_file: bool = True,
    dry_run: bool = True,
) -> Any:
    """The instance of ``settings`` (a dataclass; a tuple of them: a tuple of instances) from ``argv``.

    ``check(*instances)`` runs next (it raises on bad settings and may settle defaults that follow other
    settings); with ``--dry-run`` what it returns is printed and the process exits with status 0.
    ``positionals``: (field, nargs) pairs given without their flag; ``defaults``: the script's own defaults of
    fields of a reused dataclass (``{"ks": [5, 10, 20]}``). ``config_file=False``: no ``--config
    FILE.yaml`` (a script whose own ``--config`` means something else); ``dry_run=False``: the script's own
    ``--dry-run`` field, passed through."""
    classes = settings if isinstance(settings, tuple) else (settings,)
    argv = list(sys.argv[1:] if argv is None else argv)
    stop = dry_run and any(arg in DRY_RUN for arg in argv)
    if dry_run:
        argv = [arg for arg in argv if arg not in DRY_RUN]
    script = Script(
        name=prog,
        help="",
        description=(description or "").strip(),
        settings=lambda: classes,
        run=_no_run,
        positionals=positionals,
    )
    parser = script.parser()
    notes = ["--config FILE.yaml sets any flag (the command line wins)"] if config_file else []
    notes += ["--dry-run checks the settings and stops before any work"] if dry_run else []
    parser.epilog = "; ".join(notes) + "." if notes else None
    if defaults:
        unknown = parser.set_defaults_with_config(**defaults)
        if unknown:
            raise ValueError(f"{prog}: defaults of no field: {unknown}")
    if config_file:  # --config FILE.yaml: its values replace the defaults, the flags given win
        parsed = tuple(parser.parse_args_and_config(argv))
    else:
        parsed = tuple(parser.parse_args_into_dataclasses(argv, look_for_args_file=False))
    built = check(*parsed) if check is not None else None
    if stop:
        print(f"{prog}: settings OK (--dry-run: nothing was run)")
        if built is not None:
            print(built)
        sys.exit(0)
    return parsed if isinstance(settings, tuple) else parsed[0]


@dataclass
class Precision:
    """A script's precision (``peft_grounded.precision.script_precision``): forced by ``--fp32`` or ``--bf16``,
    else the machine's choice (bf16 where it runs natively, float32 where it is emulated)."""

    fp32: bool = field(
        default=False,
        metadata={
            "help": "float32, no autocast (neither flag: the machine's choice)",
            "aliases": ["--no-bf16", "--no_bf16"],
        },
    )
    bf16: bool = field(default=False, metadata={"help": "bf16 and autocast even where bf16 is emulated"})

    def choice(self) -> Any:
        """The :class:`~peft_grounded.precision.PrecisionChoice` (printed with its reason)."""
        from peft_grounded.precision import script_precision

        return script_precision(self.fp32, self.bf16)
