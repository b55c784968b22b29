"""What the stage commands take besides their stage's config, as dataclasses that TRL's parser turns into flags.

A stage command is parsed by ``trl.TrlParser`` from dataclasses (TRL's own scripts do the same with
``ScriptArguments``, ``SFTConfig`` and ``ModelConfig``): every field is a flag under its own name (``--sid_index``,
also ``--sid-index``) and a key of a ``--config stage.yaml``. The stage's training settings are its config
(``GroundingConfig``, ``RecommendationConfig``: TRL's ``SFTConfig`` fields); what is not already a field of it
lives here:

* :class:`ModelArguments`: the base model, the SID index, the catalogue and how the new rows start;
* :class:`SFTArguments`: the recommendation stage's grounded start, prompt format and stacked LoRA.

This module imports nothing heavy: ``--help`` of a command stays fast.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any, Literal


def column_mapping(text: str) -> dict[str, str]:
    """``"item_id=asin,title=name"`` -> ``{"item_id": "asin", "title": "name"}``."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"{part!r} is not FIELD=COLUMN")
        out[key.strip()] = value.strip()
    return out


CATALOGUE_FORMATS = ("auto", "lcrec", "amazon", "movielens", "recbole", "table")


def add_output_dir(parser: Any, help: str, old: tuple[str, ...] = ("--output", "-o"), **kwargs: Any) -> None:
    """The output folder, ``--output_dir`` in every command (as TRL's), the command's ``old`` flags as aliases."""
    parser.add_argument("--output_dir", "--output-dir", *old, dest="output_dir", help=help, **kwargs)


def add_catalogue_format_args(group: Any) -> None:
    """How a catalogue file is read (build-sids, add-items): its format and, for tables, its item columns."""
    group.add_argument("--format", default="auto", choices=CATALOGUE_FORMATS)
    group.add_argument(
        "--item-columns", type=column_mapping, help="table format: FIELD=COLUMN,... (item_id, title, ...)"
    )


def add_encoding_args(group: Any, device_help: str = "torch device of the encoder (default: cpu)") -> None:
    """How item texts are encoded (build-sids, add-items): empty texts, batch size, the embedding cache, device."""
    group.add_argument("--drop-empty-text", action="store_true", help="leave out items whose text is empty")
    group.add_argument("--batch-size", type=int, default=64, help="encoder batch size (default: %(default)s)")
    group.add_argument("--cache-dir", help="embedding cache (default: ~/.cache/peft_grounded/embeddings)")
    group.add_argument("--no-cache", action="store_true", help="neither read nor write the embedding cache")
    group.add_argument("--device", default="cpu", help=device_help)


@dataclass
class ModelArguments:
    """The base model, the SID index and catalogue a stage trains on, and how the new rows start."""

    sid_index: str = field(
        metadata={"help": "SID index directory (from `peft-grounded build-sids`).", "aliases": ["--sids"]}
    )
    model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "Local base model directory; None: the packaged SmolLM2-135M.",
            "aliases": ["--model"],
        },
    )
    catalogue: str = field(
        default="movielens-100k",
        metadata={"help": "Catalogue path or 'movielens-100k' (the one the SID index was built from)."},
    )
    weights_dtype: Literal["float32", "bfloat16", "float16"] = field(
        default="float32",
        metadata={"help": "dtype of the frozen base's weights (adapter weights always train in float32)."},
    )
    init: Literal["mean", "gaussian", "random", "centroid"] = field(
        default="mean", metadata={"help": "How the new rows start (a fresh adapter)."}
    )
    centroid_variant: Literal["items", "codebook"] = field(
        default="items",
        metadata={
            "help": "init=centroid: the centroid of the items under a code, or the code's codebook vector."
        },
    )
    max_examples: int | None = field(
        default=None, metadata={"help": "A seeded sample of this many training examples; None: all."}
    )

    def load(self) -> tuple[Any, Any]:
        """The (catalogue, SID index) named here."""
        return load_data(self.catalogue, self.sid_index)

    @property
    def dtype(self) -> Any:
        """The frozen base's ``torch.dtype``."""
        import torch

        return getattr(torch, self.weights_dtype)


@dataclass
class SFTArguments:
    """The recommendation stage's start (a grounded adapter), prompt format and stacked LoRA."""

    grounded: str | None = field(
        default=None,
        metadata={"help": "Grounded adapter directory to start the rows from (overrides --init)."},
    )
    objective: Literal["prompt", "sequence"] = field(
        default="prompt",
        metadata={
            "help": "prompt: an instruction prompt -> the next SID (the papers' setting); sequence: the history as "
            "SIDs only, every item a target (~10x the targets per second)."
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
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha."})
    lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout."})
    lora_target_modules: str = field(
        default="all-linear", metadata={"help": "LoRA target modules: 'all-linear' or comma-separated names."}
    )

    def prompt_format(self) -> Any:
        """The :class:`~peft_grounded.prompts.PromptFormat` these arguments describe."""
        from ..prompts import PromptFormat

        default = 19 if self.objective == "sequence" else 10
        history = self.max_history if self.max_history is not None else default
        return PromptFormat(
            max_history=history, with_titles=self.with_titles, objective=self.objective, prefix=self.prefix
        )

    def lora(self) -> dict[str, Any]:
        """The stacked LoRA as ``peft.LoraConfig`` keyword arguments (what ``add_lora`` takes)."""
        targets: str | list[str] = self.lora_target_modules
        if targets != "all-linear":
            targets = [t.strip() for t in targets.split(",") if t.strip()]
        return dict(
            r=self.lora_r, lora_alpha=self.lora_alpha, lora_dropout=self.lora_dropout, target_modules=targets
        )


def load_data(catalogue: str, sid_index: str) -> tuple[Any, Any]:
    """(catalogue, SID index) from their names on the command line."""
    from ..sids import SIDIndex, load_catalogue

    return load_catalogue(catalogue), SIDIndex.load(sid_index)


HELP_WIDTH = 100  # --help is rendered at a fixed width, so that the cached text is the same for everyone


def settings_parser(command: str, description: str, dataclass_types: tuple[type, ...]) -> Any:
    """TRL's parser for a stage command (``peft-grounded COMMAND``): one flag per field of ``dataclass_types``,
    old flag names as aliases, ``--config stage.yaml`` for any of them."""
    from functools import partial

    from trl import TrlParser

    formatter = partial(argparse.ArgumentDefaultsHelpFormatter, width=HELP_WIDTH, max_help_position=36)
    return TrlParser(
        dataclass_types, prog=f"peft-grounded {command}", description=description, formatter_class=formatter
    )


def add_settings_command(subparsers: Any, name: str, help: str) -> None:
    """List a stage command in ``peft-grounded --help``; :func:`peft_grounded.cli.main` hands its arguments to the
    command's own :func:`settings_parser` (and its ``--help`` to :mod:`peft_grounded.cli.help`)."""
    subparsers.add_parser(name, help=help, add_help=False)
