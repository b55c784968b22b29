"""The named recipes: settings chosen on validation, each declared once, as partial settings objects.

A :class:`Recipe` is a partial instance of one command's settings dataclasses: per dataclass (named by its
class, ``RecommendationConfig``, ``RowStart``, ...), the values of the fields it sets. ``peft-grounded
build-sids --recipe NAME`` and ``sft --recipe NAME`` take them as defaults (the flags given and a ``--config``
file win: :class:`~peft_grounded.cli.common.Command`), which checks every part against the command's
dataclasses (the class is one of them, each field is one of its fields, each value fits the field's type)
whenever it builds its parser. The ``--recipe`` help and the table of docs/cli.md are rendered from here
(:func:`help_text`, :func:`markdown`; ``python -m peft_grounded.recipes docs/cli.md`` writes the table), and
the demo's ``default`` preset (which ``benchmarks/bench_demo_recipe.py`` varies) reads its values from here.

This module imports nothing of the package: the dataclasses are named, not imported, so that every layer (the
demo's preset below the command line) reads a recipe without importing the command line.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

START = "<!-- recipes:start: rendered from peft_grounded.recipes (python -m peft_grounded.recipes docs/cli.md) -->"
END = "<!-- recipes:end -->"


@dataclass(frozen=True)
class Recipe:
    """One named recipe of one command: ``settings`` maps a settings dataclass's name to the values of the
    fields the recipe sets; ``base`` is a recipe of the same command that this one extends (its values stand
    unless ``settings`` sets them again); ``why`` says in one line what the recipe is for."""

    name: str
    command: str
    why: str
    settings: Mapping[str, Mapping[str, Any]]
    base: Recipe | None = None
    _values: Mapping[str, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.base is not None and self.base.command != self.command:
            raise ValueError(
                f"recipe {self.name!r} ({self.command}) extends {self.base.name!r} of {self.base.command}"
            )
        own = MappingProxyType({name: MappingProxyType(dict(part)) for name, part in self.settings.items()})
        object.__setattr__(self, "settings", own)
        values: dict[str, Any] = {}
        owner: dict[str, str] = {}
        for name, part in self.parts().items():
            for key, value in part.items():
                if owner.setdefault(key, name) != name:  # a flag names one field of one dataclass
                    raise ValueError(f"recipe {self.name!r}: {key!r} is set for {owner[key]} and {name}")
                values[key] = value
        object.__setattr__(self, "_values", MappingProxyType(values))

    def parts(self) -> dict[str, dict[str, Any]]:
        """Dataclass name -> the values this recipe sets on it, its base's included."""
        parts = self.base.parts() if self.base is not None else {}
        for name, part in self.settings.items():
            parts[name] = {**parts.get(name, {}), **part}
        return parts

    def values(self) -> Mapping[str, Any]:
        """Field (flag destination) -> value, over every dataclass the recipe sets."""
        return self._values

    def __getitem__(self, key: str) -> Any:
        if key not in self._values:
            raise KeyError(
                f"recipe {self.name!r} ({self.command}) sets no {key!r}; it sets {list(self._values)}"
            )
        return self._values[key]

    def of(self, settings: str | type) -> dict[str, Any]:
        """The values this recipe sets on one dataclass (a class or its name): a partial instance of it."""
        return dict(self.parts().get(settings if isinstance(settings, str) else settings.__name__, {}))

    def flags(self, own: bool = False) -> str:
        """The recipe as the command's flags (``--layers 8 --objective sequence ...``); ``own``: only the values
        it adds to its base."""
        values = {k: v for part in self.settings.values() for k, v in part.items()} if own else self._values
        return " ".join(_flag(key, value) for key, value in values.items())

    def check(self, classes: Iterable[type]) -> None:
        """Refuse a part that names no dataclass of ``classes`` (the command's settings), a field that dataclass
        lacks, or a value that does not fit the field's type."""
        import dataclasses
        import typing

        by_name = {c.__name__: c for c in classes}
        where = f"recipe {self.name!r} of {self.command}"
        if not any("recipe" in {f.name for f in dataclasses.fields(c)} for c in by_name.values()):
            raise ValueError(f"{where}: no settings dataclass of {self.command} has a 'recipe' field")
        for name, part in self.parts().items():
            if name not in by_name:
                raise ValueError(f"{where}: {name} is not a settings dataclass of it ({', '.join(by_name)})")
            cls = by_name[name]
            fields = {f.name for f in dataclasses.fields(cls) if f.init}
            hints = typing.get_type_hints(cls)
            for key, value in part.items():
                if key not in fields:
                    raise ValueError(f"{where}: {name} has no field {key!r}")
                if not _fits(value, hints.get(key, Any)):
                    raise ValueError(f"{where}: {name}.{key}={value!r} is not a {hints[key]}")


def _fits(value: Any, hint: Any) -> bool:
    """Whether ``value`` is of the (simple) type ``hint``: unions, Literal, None, bool, int, float, str,
    containers by their kind; any other type is taken on trust."""
    import types
    import typing

    origin = typing.get_origin(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, arg) for arg in typing.get_args(hint))
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(origin, type):
        return isinstance(value, origin)
    return isinstance(value, hint) if isinstance(hint, type) else True


def _flag(key: str, value: Any) -> str:
    if value is True:
        return f"--{key}"
    return f"--{key} {value:g}" if isinstance(value, float) else f"--{key} {value}"


CPU_SIDS = Recipe(
    "cpu",
    "build-sids",
    why="the SIDs of sft's cpu recipe and of the demo: from behaviour, which beat text SIDs on validation",
    settings={
        "BuildSIDsArguments": {"levels": 3, "codes": "64"},
        "ItemVectorsConfig": {"item_vectors": "behaviour"},
    },
)

CPU = Recipe(
    "cpu",
    "sft",
    why="chosen on validation per CPU minute; the demo's default preset, less the distillation; the epochs a "
    "budget allows chosen on the validation users",
    settings={
        "LoraModelConfig": {"layers": 8, "lora_r": 8, "lora_alpha": 16},
        "SFTArguments": {"objective": "sequence", "max_history": 19, "eval_per_epoch": 1, "keep_best": True},
        "RowStart": {"init": "centroid", "init_scale": 0.1},
        "RecommendationConfig": {
            "learning_rate": 3e-3,
            "per_device_train_batch_size": 8,
            "max_length": 128,
            "distill_weight": 0.5,
        },
    },
)

CPU_HOUR = Recipe(
    "cpu_hour",
    "sft",
    why="cpu for an hour of one CPU thread, with levers against overfitting",
    base=CPU,
    settings={
        "RecommendationConfig": {"max_minutes": 60.0, "augment_views": 1, "neftune_noise_alpha": 5.0},
        "LoraModelConfig": {"lora_dropout": 0.1},
    },
)

RECIPES: tuple[Recipe, ...] = (CPU_SIDS, CPU, CPU_HOUR)


def recipes_of(command: str) -> MappingProxyType[str, Recipe]:
    """The recipes of ``command`` (``sft``, ``build-sids``) by name; empty for a command without any."""
    return MappingProxyType({r.name: r for r in RECIPES if r.command == command})


def _described(recipe: Recipe) -> str:
    if recipe.base is None:
        return recipe.flags()
    return f"--recipe {recipe.base.name} + {recipe.flags(own=True)}"


def _spans(recipe: Recipe) -> str:
    if recipe.base is None:
        return f"`{recipe.flags()}`"
    return f"`--recipe {recipe.base.name}` + `{recipe.flags(own=True)}`"


def help_text(command: str) -> str:
    """The help of ``command``'s ``--recipe`` flag, rendered from its recipes."""
    listed = "; ".join(f"{r.name} = {r.why} ({_described(r)})" for r in recipes_of(command).values())
    return f"A named recipe's settings as defaults (the flags given and --config win): {listed}."


def markdown() -> str:
    """The recipes as docs/cli.md shows them: one row per recipe, its flags rendered from its settings."""
    lines = [
        START,
        "",
        "| recipe | sets | what for |",
        "|---|---|---|",
        *(f"| `{r.command} --recipe {r.name}` | {_spans(r)} | {r.why.replace('|', '/')} |" for r in RECIPES),
        "",
        END,
    ]
    return "\n".join(lines)


def render_into(text: str) -> str:
    """``text`` with its one ``START ... END`` block replaced by :func:`markdown`."""
    begin, end = text.find(START), text.find(END)
    if begin < 0 or end < begin or text.count(START) != 1:
        raise ValueError(f"expected one {START} ... {END} block")
    return text[:begin] + markdown() + text[end + len(END) :]


def main(argv: list[str] | None = None) -> int:
    """``python -m peft_grounded.recipes FILE...``: write the recipes' table into each file's block."""
    import sys
    from pathlib import Path

    for name in sys.argv[1:] if argv is None else argv:
        path = Path(name)
        text = path.read_text(encoding="utf-8")
        new = render_into(text)
        if new != text:
            path.write_text(new, encoding="utf-8")
            print(f"{path}: the recipes' table rewritten")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
