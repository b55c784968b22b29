"""``peft-grounded push`` and ``peft-grounded pull``: share a saved grounded adapter on the Hub.

The Hub token comes from ``HF_TOKEN`` or ``hf auth login``, never from the command line.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    push = subparsers.add_parser(
        "push",
        help="Push a saved grounded adapter (with card, SID index, tokenizer) to the Hub in one commit.",
        description="Push the adapter saved in ADAPTER_DIR (adapter_config.json + adapter_model.safetensors) "
        "to REPO_ID with a model card, and optionally its SID index and extended tokenizer.",
    )
    push.add_argument("adapter_dir", type=Path, help="Folder written by the adapter's save_pretrained.")
    push.add_argument("repo_id", help="Hub repo id, e.g. user/ml100k-sid-adapter.")
    push.add_argument("--tokenizer", type=Path, help="Local folder of the extended tokenizer to push too.")
    push.add_argument(
        "--sid-index", type=Path, help="Folder of the SID index (sid_index.json + .safetensors)."
    )
    push.add_argument("--metrics", help="JSON file (or inline JSON) of evaluation metrics for the card.")
    push.add_argument("--card-facts", help="JSON file (or inline JSON) of further model-card facts.")
    push.add_argument("--base-model", help="Hub id of the base model, if the adapter records a local path.")
    push.add_argument("--revision", help="Branch to push to (created if missing).")
    push.add_argument("--private", action="store_true", help="Create the repo as private.")
    push.add_argument("--message", help="Commit message.")
    push.set_defaults(func=_push)

    pull = subparsers.add_parser(
        "pull",
        help="Download a grounded adapter's safe files (no pickles) from the Hub into a folder.",
    )
    pull.add_argument("repo_id", help="Hub repo id.")
    pull.add_argument("output_dir", type=Path, help="Folder to create (must be empty unless --overwrite).")
    pull.add_argument("--revision", help="Branch, tag or commit.")
    pull.add_argument("--overwrite", action="store_true", help="Replace a non-empty output folder.")
    pull.set_defaults(func=_pull)


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


def _push(args: argparse.Namespace) -> int:
    """Errors (bad files, the Hub's refusals, no network) reach ``peft_grounded.cli.main``, which prints them."""
    from ..hub.push import DEFAULT_COMMIT_MESSAGE, push_grounded

    facts = _json_arg(args.card_facts, "--card-facts")
    if args.metrics is not None:
        facts["metrics"] = flatten_metrics(_json_arg(args.metrics, "--metrics"))
    if args.base_model:
        facts["base_model"] = args.base_model
    tokenizer = None
    if args.tokenizer is not None:
        from transformers import AutoTokenizer

        if not args.tokenizer.is_dir():
            raise FileNotFoundError(
                f"--tokenizer {args.tokenizer}: no such folder; give the folder the extended tokenizer was "
                "saved to (tokenizer.save_pretrained)"
            )
        tokenizer = AutoTokenizer.from_pretrained(str(args.tokenizer), local_files_only=True)
    info = push_grounded(
        args.adapter_dir,
        args.repo_id,
        tokenizer=tokenizer,
        index=args.sid_index,
        card_facts=facts,
        private=args.private,
        commit_message=args.message or DEFAULT_COMMIT_MESSAGE,
        revision=args.revision,
    )
    print(info.commit_url)
    return 0


def _pull(args: argparse.Namespace) -> int:
    from ..hub.pull import pull_grounded

    folder = pull_grounded(args.repo_id, args.output_dir, revision=args.revision, overwrite=args.overwrite)
    print(folder)
    return 0
