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
:class:`peft_grounded.sids.model.RowStart`, a settings dataclass of ``ground`` and ``sft`` passed down as it is
to the model it starts.

A command is a :class:`Command`: its name, help, settings dataclasses and the function that runs on them.
This module imports nothing heavy (TRL's parser is imported when a command parses; it loads without torch or
transformers), so ``--help`` of a command whose settings are light answers in a fraction of a second.

Also here, for the commands and the benchmark scripts: the named recipes of ``sft --recipe`` and
``build-sids --recipe`` (:data:`RECIPES`, :data:`SID_RECIPES`), and :func:`parse_script_args`, the
``--dry-run`` of the scripts in ``benchmarks/``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache, partial
from types import MappingProxyType
from typing import Any, Literal

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
    eval_users: int | None = field(
        default=None,
        metadata={
            "help": "A seeded sample of this many validation users for --eval_every (None: all of them)."
        },
    )
    keep_best: bool = field(
        default=False,
        metadata={
            "help": "End with the adapter of the best validation Recall@10 (early stopping; needs --eval_every): "
            "each new best is kept in OUTPUT_DIR/best, and the last weights are evaluated too."
        },
    )
    recipe: Literal["cpu", "cpu_hour"] | None = field(
        default=None,
        metadata={
            "help": "A named recipe's settings as defaults (the flags given and --config win): cpu = the recipe "
            "chosen on validation per CPU minute, the demo's (--layers 8 --objective sequence --max_history 19 "
            "--init centroid --init_scale 0.1 --lora_r 8 --lora_alpha 16 --learning_rate 3e-3 "
            "--per_device_train_batch_size 8 --max_length 128 --distill_weight 0.5); cpu_hour = cpu for an hour "
            "of one CPU thread (--max_minutes 60, --lora_dropout 0.1 --augment_views 1 --neftune_noise_alpha 5, "
            "--eval_every 1000 --keep_best). peft_grounded.cli.common lists both."
        },
    )

    def __post_init__(self) -> None:
        from .. import checks

        checks.raise_problems(
            "SFTArguments",
            [
                checks.int_at_least("eval_every", self.eval_every, 0, flag="--eval_every"),
                None
                if self.eval_users is None
                else checks.int_at_least("eval_users", self.eval_users, 1, flag="--eval_users"),
                "--keep_best picks among validation points: give --eval_every N (N >= 1)"
                if self.keep_best and not self.eval_every
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
    ``check`` validates the settings together (what one dataclass cannot see) before anything runs.
    """

    name: str
    help: str
    description: str
    settings: Callable[[], tuple[type, ...]]
    run: Callable[..., int | None]
    positionals: tuple[tuple[str, str], ...] = ()
    check: Callable[..., None] | None = None
    # name -> {flag destination: value}: ``--recipe NAME`` (or ``recipe: NAME`` in --config) sets those defaults
    recipes: Callable[[], Mapping[str, Mapping[str, Any]]] | None = None

    def parser(self) -> Any:
        """TRL's parser: one flag per field (``--sid_index`` or ``--sid-index``; no abbreviations), ``--config
        FILE.yaml`` for any of them; it reads the arguments it is given, nothing else (:func:`parser_class`)."""
        formatter = partial(argparse.ArgumentDefaultsHelpFormatter, width=HELP_WIDTH, max_help_position=36)
        parser = parser_class()(
            self.settings(),
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
        recipe = _recipe_named(argv) if self.recipes is not None else None
        if recipe is not None:
            recipes = self.recipes()
            if recipe not in recipes:
                raise ValueError(
                    f"{self.name}: --recipe {recipe!r} is unknown; choose one of {', '.join(recipes)}"
                )
            parser.set_defaults_with_config(**recipes[recipe])  # --config's values and the flags given win
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


# Named recipes for ``peft-grounded sft --recipe NAME``: defaults for the flags that the flags given (and a
# ``--config`` file) override.
#
# ``cpu``: the recipe chosen on validation per CPU minute (BENCHMARKS.md, "A recipe chosen on validation"), the
# demo's default preset: the first 8 of the base's decoder blocks, the sequence objective over 19 items of
# history with the SID-only softmax (the default wherever it applies), the centroid start pulled to a tenth of its
# spread around the vocabulary mean, a rank-8 LoRA, learning rate 3e-3, batches of 8 windows of at most 128
# tokens, and distillation from a SASRec teacher at weight 0.5 (BENCHMARKS.md, "Distillation from SASRec on
# Amazon Office"; the demo's 150 steps leave it out, as the teacher's fit would cost minutes there). The budget
# (``--max_minutes`` or ``--max_steps``) stays the user's.
#
# ``cpu_hour``: ``cpu`` for an hour of one CPU thread (BENCHMARKS.md, "Distillation inside the hour"): the
# levers that keep a run learning past its fourth epoch (LoRA dropout 0.1, one altered copy of every history,
# NEFTune noise 5), the learning rate decaying to 0 at 60 minutes, and the adapter of the best validation Recall@10
# of all validation users every 1,000 steps (``keep_best``). At the ``cpu`` recipe's two epochs these levers cost
# step time for nothing, so ``cpu`` leaves them out.
#
# ``build-sids --recipe cpu``: the SIDs this recipe was chosen with, 3 levels of 64 codes, built from behaviour
# (SASRec's item embeddings of the training split; the text map for items with few interactions), which beat
# the text SIDs on validation (BENCHMARKS.md, "Levers against the peers").

# flag destinations (the settings dataclasses' field names) -> values
_CPU: dict[str, Any] = {
    "layers": 8,
    "objective": "sequence",
    "max_history": 19,
    "init": "centroid",
    "init_scale": 0.1,
    "lora_r": 8,
    "lora_alpha": 16,
    "learning_rate": 3e-3,
    "per_device_train_batch_size": 8,
    "max_length": 128,
    "distill_weight": 0.5,
}
_HOUR_LEVERS: dict[str, Any] = {
    "max_minutes": 60.0,
    "lora_dropout": 0.1,
    "augment_views": 1,
    "neftune_noise_alpha": 5.0,
    "eval_every": 1000,
    "keep_best": True,
}
RECIPES: MappingProxyType[str, MappingProxyType[str, Any]] = MappingProxyType(
    {"cpu": MappingProxyType(_CPU), "cpu_hour": MappingProxyType(_CPU | _HOUR_LEVERS)}
)

# build-sids: flag destinations -> values
SID_RECIPES: MappingProxyType[str, MappingProxyType[str, Any]] = MappingProxyType(
    {"cpu": MappingProxyType({"levels": 3, "codes": "64", "item_vectors": "behaviour"})}
)
