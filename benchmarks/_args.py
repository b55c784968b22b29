"""The benchmark scripts' settings: dataclasses, parsed as the package's commands parse theirs, and ``--dry-run``.

A script declares each setting once, as a dataclass field with ``metadata={"help": ...}``, and calls :func:`parse`, which parses them with TRL's parser
through the package's :class:`~peft_grounded.cli.common.Command`: one flag per field (``--foo_bar`` and
``--foo-bar``), ``--config FILE.yaml`` for any of them, positional fields as the command's ``positionals``. A
setting the package declares is never declared again here: the script parses the package's dataclass (``RowStart``)
or the fields it sets of one (:func:`package_fields`), under the package's flags, its own default of such a field
given to :func:`parse` (``defaults``), from the package's object where one holds it (a recipe, the demo's preset);
tests/test_bench_settings_declared_once.py holds the scripts to it.
``check`` builds what the run would build from the settings (configs, budgets), so that a bad setting fails in
seconds, not after the long work, and ``--dry-run`` stops there: the test of the documented commands
(tests/test_documented_commands.py) runs every ``python benchmarks/...`` command of the docs this way.

A script imports this module as ``benchmarks._args`` (tests, or the repository root on ``sys.path``) or, run
as a file (``python benchmarks/NAME.py``: its folder on ``sys.path``), as ``_args``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
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


def package_fields(
    settings: type, *names: str, parser: Mapping[str, Mapping[str, Any]] | None = None
) -> type:
    """The fields ``names`` of the package's settings dataclass ``settings``, as it declares them (type, default,
    help), as a dataclass of their own for :func:`parse`: a script that sets some fields of a package dataclass
    (not all of them, or not one whose other fields would clash with its own) parses the package's declaration of
    each under the package's flag (``--learning_rate`` / ``--learning-rate``) instead of declaring the setting
    again. The script's own default of such a field goes to :func:`parse`'s ``defaults``; ``parser``: how the
    script's parser reads a field beyond its declaration (``{"peers": {"action": ZeroOrMore}}``). A tuple field
    (``tuple[str, ...]``) is parsed as a list. The class names its source (``__settings_of__``); its instance's
    values are the package's field values (``dataclasses.asdict``)."""
    declared = {f.name: f for f in dataclasses.fields(settings)}
    hints = typing.get_type_hints(settings)
    extra = dict(parser or {})
    unknown = [n for n in (*names, *extra) if n not in declared or not declared[n].init]
    if unknown or not names:
        raise ValueError(f"{settings.__name__} has no field(s) {unknown} to parse (names: {names})")
    if set(extra) - set(names):
        raise ValueError(f"parser settings of fields not taken: {sorted(set(extra) - set(names))}")
    specs = []
    for name in names:
        source = declared[name]
        if "help" not in source.metadata:
            raise ValueError(f"{settings.__name__}.{name} declares no help (metadata={{'help': ...}})")
        metadata = {**source.metadata, **extra.get(name, {})}
        if source.default is not dataclasses.MISSING:
            value = source.default
            spec = (
                field(default_factory=lambda value=value: list(value), metadata=metadata)
                if isinstance(value, tuple)
                else field(default=value, metadata=metadata)
            )
        elif source.default_factory is not dataclasses.MISSING:
            spec = field(default_factory=source.default_factory, metadata=metadata)
        else:
            spec = field(metadata=metadata)
        specs.append((name, _listed(hints[name]), spec))
    view = dataclasses.make_dataclass(f"{settings.__name__}Fields", specs)
    view.__module__ = settings.__module__
    view.__doc__ = (
        f"{', '.join(names)}: fields of {settings.__module__}.{settings.__qualname__}, as it declares them."
    )
    view.__settings_of__ = settings
    return view


def _listed(hint: Any) -> Any:
    """``hint`` with ``tuple[X, ...]`` as ``list[X]`` (TRL's parser reads lists), in a union too."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return list[args[0]]
    if origin in (typing.Union, types.UnionType) and any(typing.get_origin(a) is tuple for a in args):
        return typing.Union[tuple(_listed(a) for a in args)]  # noqa: UP007 (built from a tuple of types)
    return hint


def field_default(settings: type, name: str) -> Any:
    """The default the package's dataclass ``settings`` declares for its field ``name`` (a script's own default of
    another field taken from it)."""
    found = {f.name: f for f in dataclasses.fields(settings)}[name]
    if found.default_factory is not dataclasses.MISSING:
        return found.default_factory()
    if found.default is dataclasses.MISSING:
        raise ValueError(f"{settings.__name__}.{name} has no default")
    return found.default


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
