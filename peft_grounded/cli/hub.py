"""``peft-grounded push`` and ``peft-grounded pull``: share a saved grounded adapter on the Hub.

The flags are the fields of :class:`PushArguments` and :class:`PullArguments`, parsed by TRL's parser; the
operands (the folder and the repo id, source first) may also be given without their flags. The Hub token
comes from ``HF_TOKEN`` or ``hf auth login``, never from the command line.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .common import Command


def _require(command: str, **values: Any) -> None:
    missing = [name for name, value in values.items() if value is None]
    if missing:
        names = " ".join(name.upper() for name in values)
        raise ValueError(f"{command}: give {', '.join(missing)} ({command} {names}, or --{missing[0]})")


@dataclass
class PushArguments:
    """The saved adapter, the Hub repo, and what goes with them."""

    adapter_dir: str | None = field(
        default=None,
        metadata={"help": "Folder written by the adapter's save_pretrained (also the 1st argument)."},
    )
    repo_id: str | None = field(
        default=None, metadata={"help": "Hub repo id, e.g. user/ml100k-sid-adapter (also the 2nd argument)."}
    )
    tokenizer: str | None = field(
        default=None, metadata={"help": "Local folder of the extended tokenizer to push too."}
    )
    sid_index: str | None = field(
        default=None,
        metadata={"help": "Folder of the SID index (sid_index.json + .safetensors)."},
    )
    metrics: str | None = field(
        default=None, metadata={"help": "JSON file (or inline JSON) of evaluation metrics for the card."}
    )
    card_facts: str | None = field(
        default=None, metadata={"help": "JSON file (or inline JSON) of further model-card facts."}
    )
    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "The base model's Hub id for the card, where the adapter records a local path."},
    )
    revision: str | None = field(default=None, metadata={"help": "Branch to push to (created if missing)."})
    private: bool = field(default=False, metadata={"help": "Create the repo as private."})
    message: str | None = field(default=None, metadata={"help": "Commit message."})

    def __post_init__(self) -> None:
        _require("push", adapter_dir=self.adapter_dir, repo_id=self.repo_id)


@dataclass
class PullArguments:
    """The Hub repo and the folder to create."""

    repo_id: str | None = field(default=None, metadata={"help": "Hub repo id (also the 1st argument)."})
    output_dir: str | None = field(
        default=None,
        metadata={"help": "Folder to create, empty unless --overwrite (also the 2nd argument)."},
    )
    revision: str | None = field(default=None, metadata={"help": "Branch, tag or commit."})
    overwrite: bool = field(default=False, metadata={"help": "Replace a non-empty output folder."})

    def __post_init__(self) -> None:
        _require("pull", repo_id=self.repo_id, output_dir=self.output_dir)


def _json_arg(value: str | None, what: str) -> dict[str, Any]:
    """A JSON object given inline (``{...}``) or as a file path."""
    if value is None:
        return {}
    if not value.lstrip().startswith("{"):
        from .._io import read_json

        data = read_json(value, fix=f"give {what} a JSON file or inline JSON")
    else:
        try:
            data = json.loads(value)
        except json.JSONDecodeError as err:
            raise ValueError(f"{what}: not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{what}: expected a JSON object, got {type(data).__name__}")
    return data


def flatten_metrics(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"test": {"all": {"recall@10": 0.1}}}`` -> ``{"test / all / recall@10": 0.1}``; scalars only."""
    flat: dict[str, Any] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat |= flatten_metrics(value, f"{name} / ")
        elif isinstance(value, (int, float, str)) or value is None:
            flat[name] = value
    return flat


def run_push(args: PushArguments) -> int:
    """Errors (bad files, the Hub's refusals, no network) reach ``peft_grounded.cli.main``, which prints them."""
    from ..hub.push import DEFAULT_COMMIT_MESSAGE, push_grounded

    facts = _json_arg(args.card_facts, "--card-facts")
    if args.metrics is not None:
        facts["metrics"] = flatten_metrics(_json_arg(args.metrics, "--metrics"))
    if args.model_name_or_path:
        facts["base_model"] = args.model_name_or_path
    tokenizer = None
    if args.tokenizer is not None:
        from transformers import AutoTokenizer

        if not Path(args.tokenizer).is_dir():
            raise FileNotFoundError(
                f"--tokenizer {args.tokenizer}: no such folder; give the folder the extended tokenizer was "
                "saved to (tokenizer.save_pretrained)"
            )
        tokenizer = AutoTokenizer.from_pretrained(str(args.tokenizer), local_files_only=True)
    info = push_grounded(
        Path(args.adapter_dir),
        args.repo_id,
        tokenizer=tokenizer,
        index=None if args.sid_index is None else Path(args.sid_index),
        card_facts=facts,
        private=args.private,
        commit_message=args.message or DEFAULT_COMMIT_MESSAGE,
        revision=args.revision,
    )
    print(info.commit_url)
    return 0


def run_pull(args: PullArguments) -> int:
    from ..hub.load import pull_grounded

    folder = pull_grounded(
        args.repo_id, Path(args.output_dir), revision=args.revision, overwrite=args.overwrite
    )
    print(folder)
    return 0


PUSH = Command(
    name="push",
    help="Push a saved grounded adapter (with card, SID index, tokenizer) to the Hub in one commit.",
    description="Push the adapter saved in ADAPTER_DIR (adapter_config.json + adapter_model.safetensors) to "
    "REPO_ID with a model card, and optionally its SID index and extended tokenizer.",
    settings=lambda: (PushArguments,),
    run=run_push,
    positionals=(("adapter_dir", "?"), ("repo_id", "?")),
)
PULL = Command(
    name="pull",
    help="Download a grounded adapter's safe files (no pickles) from the Hub into a folder.",
    description="Download REPO_ID's adapter, card, SID index and tokenizer files (safetensors and JSON, never "
    "pickles) into OUTPUT_DIR, which appears complete or not at all.",
    settings=lambda: (PullArguments,),
    run=run_pull,
    positionals=(("repo_id", "?"), ("output_dir", "?")),
)
