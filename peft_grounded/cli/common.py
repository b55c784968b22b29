"""Every command's settings are dataclasses that TRL's parser turns into flags.

Each command is parsed by ``trl.TrlParser`` from dataclasses (TRL's own scripts do the same with
``ScriptArguments``, ``SFTConfig`` and ``ModelConfig``): every field is a flag under its own name
(``--sid_index``, also ``--sid-index``) and a key of a ``--config FILE.yaml``. A stage's training settings are
its config (``GroundingConfig``, ``RecommendationConfig``: TRL's ``SFTConfig`` fields); the base model and the
stacked LoRA are TRL's ``ModelConfig`` fields (:class:`~.model_config.GroundedModelConfig`); what is neither
lives here or beside its command:

* :class:`DataArguments`: the SID index and catalogue a stage trains on, and the example cap;
* :class:`SFTArguments`: the recommendation stage's grounded start and prompt format.

How the new rows start (``--init``, ``--centroid_variant``, ``--init_scale``) is
:class:`peft_grounded.sids.extended_base.RowStart`, a settings dataclass of ``ground`` and ``sft`` passed down as it is
to the model it starts.

A command is a :class:`Command`: its name, help, settings dataclasses and the function that runs on them.
This module imports nothing heavy (TRL's parser is imported when a command parses; it loads without torch or
transformers), so ``--help`` of a command whose settings are light answers in a fraction of a second.

``sft --recipe NAME`` and ``build-sids --recipe NAME`` take a named recipe's settings as defaults: the recipes
are :mod:`peft_grounded.recipes`'s, checked against the command's dataclasses when its parser is built.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache, partial
from typing import Any, Literal

from .. import recipes

CATALOGUE_FORMATS = ("auto", "lcrec", "amazon", "movielens", "recbole", "table")
HELP_WIDTH = 100


def column_mapping(text: str) -> dict[str, str]:
    """``"item_id=asin,title=name"`` -> ``{"item_id": "asin", "title": "name"}``."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"{part!r} is not FIELD=COLUMN (write FIELD=COLUMN,FIELD=COLUMN)")
        out[key.strip()] = value.strip()
    return out


def csv_list(values: Sequence[str] | str | None) -> list[str]:
    """``["a,b", "c"]`` or ``"a,b,c"`` -> ``["a", "b", "c"]``: a list flag takes spaces, commas or both."""
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    return [part.strip() for value in values for part in str(value).split(",") if part.strip()]


def catalogue_field(purpose: str = "") -> Any:
    """The ``--catalogue`` field of a command that reads a SID index: default the index's own catalogue."""
    return field(
        default=None,
        metadata={
            "help": f"{purpose}Catalogue path or 'movielens-100k'; None: the one the SID index was built from "
            "(recorded by build-sids, checked by its fingerprint). A catalogue that is not the index's is refused."
        },
    )


def recipe_field(command: str) -> Any:
    """The ``--recipe NAME`` field of ``command``: its recipes' names and help, rendered from
    :mod:`peft_grounded.recipes`."""
    return field(
        default=None,
        metadata={"help": recipes.help_text(command), "choices": tuple(recipes.recipes_of(command))},
    )


@dataclass
class DataArguments:
    """The SID index and catalogue a stage trains on, and how many of its examples."""

    sid_index: str = field(metadata={"help": "SID index directory (from `peft-grounded build-sids`)."})
    catalogue: str | None = catalogue_field()
    max_examples: int | None = field(
        default=None, metadata={"help": "A seeded sample of this many training examples; None: all."}
    )

    def load(self) -> tuple[Any, Any]:
        """The (catalogue, SID index) named here."""
        return load_data(self.catalogue, self.sid_index)


@dataclass
class SFTArguments:
    """The recommendation stage's start (a grounded adapter) and prompt format."""

    grounded: str | None = field(
        default=None,
        metadata={"help": "Grounded adapter directory to start the rows from (overrides --init)."},
    )
    objective: Literal["prompt", "sequence"] = field(
        default="prompt",
        metadata={
            "help": "prompt: an instruction prompt -> the next SID (the papers' setting); sequence: the history as "
            "SIDs only, every item a target."
        },
    )
    max_history: int | None = field(
        default=None,
        metadata={"help": "Items of history in a prompt; None: 10 for prompt, 19 for sequence; 0: all."},
    )
    with_titles: bool = field(default=False, metadata={"help": "Show titles next to the history's SIDs."})
    prefix: str = field(
        default="", metadata={"help": "sequence objective: a short instruction after the start token."}
    )
    eval_every: int = field(
        default=0,
        metadata={
            "help": "Decode the validation users (the leave-one-out split's, the history left out) every N steps "
            "and log their Recall@5/10 and NDCG@5/10 (eval_recall@10...). 0: off."
        },
    )
    eval_per_epoch: int = field(
        default=0,
        metadata={
            "help": "Instead of --eval_every's steps: decode the validation users this many times an epoch, at "
            "equal steps (1: each epoch's end), so that a recipe carries to a catalogue of another size; with "
            "--keep_best and --max_minutes the epochs the budget allows are chosen on validation. 0: off."
        },
    )
    eval_users: int | None = field(
        default=None,
        metadata={
            "help": "A seeded sample of this many validation users for --eval_every (None: all of them)."
        },
    )
    keep_best: bool = field(
        default=False,
        metadata={
            "help": "End with the adapter of the best validation Recall@10 (early stopping; needs --eval_every "
            "or --eval_per_epoch): "
            "each new best is kept in OUTPUT_DIR/best, and the last weights are evaluated too."
        },
    )
    recipe: str | None = recipe_field("sft")

    def __post_init__(self) -> None:
        from .. import checks

        checks.raise_problems(
            "SFTArguments",
            [
                checks.int_at_least("eval_every", self.eval_every, 0, flag="--eval_every"),
                checks.int_at_least("eval_per_epoch", self.eval_per_epoch, 0, flag="--eval_per_epoch"),
                "--eval_every counts steps and --eval_per_epoch epochs: give one of them (over a recipe's "
                "--eval_per_epoch, add --eval_per_epoch 0)"
                if self.eval_every and self.eval_per_epoch
                else None,
                None
                if self.eval_users is None
                else checks.int_at_least("eval_users", self.eval_users, 1, flag="--eval_users"),
                "--keep_best picks among validation points: give --eval_every N or --eval_per_epoch M (>= 1)"
                if self.keep_best and not self.eval_every and not self.eval_per_epoch
                else None,
            ],
        )

    def prompt_format(self) -> Any:
        """The :class:`~peft_grounded.prompts.PromptFormat` these arguments describe."""
        from ..prompts import PromptFormat

        default = 19 if self.objective == "sequence" else 10
        history = self.max_history if self.max_history is not None else default
        return PromptFormat(
            max_history=history, with_titles=self.with_titles, objective=self.objective, prefix=self.prefix
        )


@dataclass
class CatalogueArguments:
    """How a catalogue file is read (build-sids, add-items)."""

    catalogue_format: Literal["auto", "lcrec", "amazon", "movielens", "recbole", "table"] = field(
        default="auto", metadata={"help": "The catalogue's format (auto: detected)."}
    )
    item_columns: str | None = field(
        default=None, metadata={"help": "table format: FIELD=COLUMN,... (item_id, title, ...)."}
    )

    def catalogue_options(self) -> dict[str, Any]:
        return {"item_columns": column_mapping(self.item_columns)} if self.item_columns else {}


@dataclass
class EncodingArguments:
    """How item texts are encoded (build-sids, add-items)."""

    drop_empty_text: bool = field(default=False, metadata={"help": "Leave out items whose text is empty."})
    encode_batch_size: int = field(default=64, metadata={"help": "Item texts per encoder batch."})
    cache_dir: str | None = field(
        default=None, metadata={"help": "Embedding cache; None: ~/.cache/peft_grounded/embeddings."}
    )
    no_cache: bool = field(default=False, metadata={"help": "Neither read nor write the embedding cache."})
    device: str = field(default="cpu", metadata={"help": "torch device of the encoder (and of RQ-KMeans)."})
    no_progress: bool = field(default=False, metadata={"help": "No progress bar."})

    def keywords(self) -> dict[str, Any]:
        """The encoding keywords of ``build_sids`` and ``add_items_to``."""
        return {
            "empty_text": "drop" if self.drop_empty_text else "error",
            "batch_size": self.encode_batch_size,
            "cache_dir": self.cache_dir,
            "use_cache": not self.no_cache,
            "device": self.device,
            "show_progress": not self.no_progress,
        }

    def __post_init__(self) -> None:
        from .. import checks

        problem = checks.int_at_least(
            "encode_batch_size", self.encode_batch_size, 1, flag="--encode-batch-size"
        )
        checks.raise_problems("EncodingArguments", [problem])


def load_data(catalogue: str | None, sid_index: str) -> tuple[Any, Any]:
    """(catalogue, SID index) from the command line: the index, and the catalogue it was built from (the one
    given, checked against the index's record, or the recorded one)."""
    from ..sids import SIDIndex
    from ..sids.catalogue_source import index_catalogue

    index = SIDIndex.load(sid_index)
    return index_catalogue(index, catalogue), index


def _no_dataclasses() -> tuple[type, ...]:
    return ()


@cache
def parser_class() -> type:
    """TRL's ``TrlParser``, reading only the arguments it is given (and ``--config FILE.yaml``).

    transformers' parser also reads, by default, a file named after the running program, ``sys.argv[0]`` with
    the suffix ``.args`` (``bin/peft-grounded.args``; beside the user's own script when it calls
    :func:`peft_grounded.cli.main`; pytest's ``__main__.args`` under pytest), and puts its flags before the
    given ones: flags nobody gave, and an error where that folder cannot be entered (a child process running
    as another user)."""
    from trl import TrlParser

    class CommandParser(TrlParser):
        __doc__ = parser_class.__doc__

        def parse_args_into_dataclasses(self, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
            kwargs["look_for_args_file"] = False
            return super().parse_args_into_dataclasses(*args, **kwargs)

    return CommandParser


@dataclass(frozen=True)
class Command:
    """One ``peft-grounded`` command: its settings dataclasses, parsed by TRL's parser, and what runs on them.

    ``settings`` returns the dataclasses (importing heavy ones, e.g. an ``SFTConfig``, only when called);
    ``run`` takes one instance of each, in order. ``positionals`` are the command's operands, fields also given
    without their flag: (field, nargs) pairs (``push ADAPTER_DIR REPO_ID``, ``diagnose ADAPTER...``).
    ``check`` validates the settings together (what one dataclass cannot see) before anything runs. The
    command's recipes (``--recipe NAME``, or ``recipe: NAME`` in --config, sets their values as defaults) are
    :func:`peft_grounded.recipes.recipes_of` its name.
    """

    name: str
    help: str
    description: str
    settings: Callable[[], tuple[type, ...]]
    run: Callable[..., int | None]
    positionals: tuple[tuple[str, str], ...] = ()
    check: Callable[..., None] | None = None

    def parser(self) -> Any:
        """TRL's parser: one flag per field (``--sid_index`` or ``--sid-index``; no abbreviations), ``--config
        FILE.yaml`` for any of them; it reads the arguments it is given, nothing else (:func:`parser_class`)."""
        formatter = partial(argparse.ArgumentDefaultsHelpFormatter, width=HELP_WIDTH, max_help_position=36)
        classes = self.settings()
        for recipe in recipes.recipes_of(self.name).values():
            recipe.check(classes)  # every part a field of these dataclasses, of its type
        parser = parser_class()(
            classes,
            prog=f"peft-grounded {self.name}",
            description=self.description,
            formatter_class=formatter,
            allow_abbrev=False,
            epilog="--config FILE.yaml sets any flag (the command line wins); --dry-run checks the settings "
            "and stops before any work.",
        )
        for name, nargs in self.positionals:
            parser.add_argument(
                name, nargs=nargs, default=argparse.SUPPRESS, metavar=name.upper(), help=f"= --{name}"
            )
        return parser

    def parse(self, argv: Sequence[str]) -> tuple[Any, ...]:
        """The settings objects from command-line arguments (and ``--config FILE.yaml``), checked."""
        argv = list(argv)
        parser = self.parser()
        known = recipes.recipes_of(self.name)
        recipe = _recipe_named(argv) if known else None
        if recipe is not None:
            if recipe not in known:
                raise ValueError(
                    f"{self.name}: --recipe {recipe!r} is unknown; choose one of {', '.join(known)}"
                )
            # defaults: --config's values and the flags given win
            parser.set_defaults_with_config(**known[recipe].values())
        settings = tuple(parser.parse_args_and_config(argv))
        if self.check is not None:
            self.check(*settings)
        return settings

    def main(self, argv: Sequence[str]) -> int:
        """Parse, then run; ``--dry-run``: parse and check only, print the settings, run nothing."""
        argv = list(argv)
        dry_run = "--dry-run" in argv or "--dry_run" in argv
        settings = self.parse([a for a in argv if a not in ("--dry-run", "--dry_run")])
        if dry_run:
            for s in settings:
                print(f"{type(s).__name__}: {_summary(s)}")
            print(f"{self.name}: settings OK (--dry-run: nothing was run)")
            return 0
        return int(self.run(*settings) or 0)


def _recipe_named(argv: Sequence[str]) -> str | None:
    """The recipe ``argv`` names with ``--recipe NAME`` / ``--recipe=NAME``, else in its ``--config`` file."""
    for i, arg in enumerate(argv):
        if arg == "--recipe" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--recipe="):
            return arg.split("=", 1)[1]
    if "--config" in argv and argv.index("--config") + 1 < len(argv):
        import yaml

        with open(argv[argv.index("--config") + 1]) as f:
            config = yaml.safe_load(f)
        if isinstance(config, dict) and config.get("recipe") is not None:
            return str(config["recipe"])
    return None


def _summary(settings: Any) -> str:
    """The fields of ``settings`` that differ from a default instance's (or that have no default)."""
    import dataclasses

    try:
        baseline = type(settings)()
    except (TypeError, ValueError):  # required fields
        baseline = None
    shown = []
    for f in dataclasses.fields(settings):
        if not f.init:
            continue
        value = getattr(settings, f.name, None)
        default = getattr(baseline, f.name, dataclasses.MISSING)
        if value != default:
            shown.append(f"{f.name}={value!r}")
    return ", ".join(shown) or "defaults"
