"""What :meth:`GroundedRecommender.from_pretrained` loads, and how it checks it: the folder or Hub repo, the
adapter onto its base (the rows each decoding step normalises over read before a merge folds it away), or a
merged folder with its ``grounded_serving.json`` (checked field by field).

Users' histories as the recommender takes them (checked against the SID index, read from JSONL:
:func:`check_histories`, :func:`read_histories`) are below.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..decoding.heads import SIDSoftmax

SERVING_RECORD = "grounded_serving.json"  # what a merged model folder records besides the model
SERVING_FORMAT = 1
SERVING_FIELDS = {
    "format": int,
    "prompt_format": dict,
    "sid_index_fingerprint": str,
    "sid_token_ids": (list, type(None)),
}


def open_recommender_source(
    path_or_hub_id: str | Path, revision: str | None, token: str | bool | None
) -> Any:
    """The folder or Hub repo; a Hub that cannot be reached is a :class:`GroundedHubError` saying so."""
    from ..hub.repo import GroundedHubError, open_source

    try:
        return open_source(path_or_hub_id, revision=revision, token=token)
    except GroundedHubError:
        raise
    except Exception as err:
        raise network_error(err, path_or_hub_id) from err


def fetch_safe_files(source: Any, patterns: Sequence[str]) -> Path:
    try:
        return source.fetch(patterns)
    except Exception as err:
        raise network_error(err, source.repo_id) from err


def network_error(err: BaseException, repo: Any) -> Exception:
    from ..checks import describe
    from ..hub.repo import GroundedHubError

    message = describe(err)
    if message is None or isinstance(err, ValueError):
        return err if isinstance(err, Exception) else RuntimeError(str(err))
    return GroundedHubError(
        f"cannot load {str(repo)!r}: {message}. Nothing was written; a local folder of the adapter loads offline"
    )


def serving_dtype(dtype: str, device: str) -> Any:
    import torch

    if dtype == "auto":  # bf16 on a GPU that has it; float32 on a CPU: the exact lists (bf16 reorders near
        # ties there; BENCHMARKS.md, "Serving in bf16 where the CPU has it")
        from ..precision import choose_precision

        return (
            torch.bfloat16 if device.startswith("cuda") and choose_precision(device).bf16 else torch.float32
        )
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"dtype={dtype!r}: choose auto, float32, bfloat16 or float16")
    return getattr(torch, dtype)


def index_for(sid_index: Any, folder: Path, where: str, recorded: str | None = None) -> Any:
    """The given index, or the one in ``folder``'s ``sid_index/`` checked to be the version (fingerprint
    ``recorded``, from the adapter's SID record, already read) the adapter was trained or grown on."""
    from ..hub.load import stored_index
    from ..hub.repo import SID_INDEX_DIR, GroundedHubError
    from ..sids import SIDIndex

    if sid_index is not None:
        return sid_index if isinstance(sid_index, SIDIndex) else SIDIndex.load(sid_index)
    link = folder / SID_INDEX_DIR
    if link.is_symlink() and not link.is_dir():
        raise GroundedHubError(
            f"{link} is a link to {os.readlink(link)}, which is not a folder: point it at the index's folder, or "
            "pass the index (sid_index=..., --sid_index DIR)"
        )
    if link.is_dir():
        return stored_index(folder, where, recorded)
    raise GroundedHubError(
        f"The {where} holds no SID index ({SID_INDEX_DIR}/): pass the index the adapter was trained or grown "
        "with (sid_index=..., --sid_index DIR)"
    )


def base_path_for(config: Any, folder: Path) -> str:
    from ..sids.extended_base import base_model_path

    try:
        return base_model_path(str(folder), config.base_model_name_or_path or "")
    except FileNotFoundError:
        return config.base_model_name_or_path  # a Hub id: transformers fetches it (safetensors only)


def load_adapter_parts(
    folder: Path,
    where: str,
    sid_index: Any,
    model_path: str | None,
    dtype: Any,
    merge: bool,
    sid_softmax: SIDSoftmax,
) -> tuple[Any, Any, Any, Any, Any]:
    """``(model, tokenizer, index, prompt format, rows)``: the rows each step normalises over are read from
    the adapter before a merge folds it away (``False``: the whole vocabulary). ``adapter_config.json`` is
    read once, here, and its config passed to every check and to PEFT; so is the SID record."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..decoding.heads import sid_rows
    from ..hub.load import attach_grounded
    from ..hub.repo import load_grounded_config
    from ..sids.extended_base import FINGERPRINT_KEY, check_model_dir, prompt_format_of, read_sid_record

    config = load_grounded_config(folder, where)
    record = read_sid_record(folder)
    recorded = record.get(FINGERPRINT_KEY)
    index = index_for(sid_index, folder, where, recorded)
    index.check_adapter(config, where=f"the adapter in the {where}", recorded=recorded)
    base = model_path or base_path_for(config, folder)
    if Path(str(base)).expanduser().exists():
        base = check_model_dir(base, "model_name_or_path")
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype, use_safetensors=True)
    model = attach_grounded(model, tokenizer, folder, config, where, record=record)
    fmt = prompt_format_of(model)
    rows = sid_rows(model, sid_softmax)
    if merge:
        model = model.merge_and_unload()
    return model, tokenizer, index, fmt, False if rows is None else rows


def load_merged_parts(
    folder: Path, where: str, sid_index: Any, dtype: Any, sid_softmax: SIDSoftmax
) -> tuple[Any, Any, Any, Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..prompts import PromptFormat
    from ..sids.extended_base import check_model_dir

    check_model_dir(folder, "path_or_hub_id")
    index = index_for(sid_index, folder, where)
    record = read_serving_record(folder, where)
    if record is None and sid_softmax is None:
        raise ValueError(
            f"the merged model in the {where} has no {SERVING_RECORD}, so how it was trained to normalise each "
            "SID step (and its prompt format) is unknown, and a guess serves other lists: save merged models "
            "with GroundedRecommender.save_merged, or pass sid_softmax=True (sft's default) or False"
        )
    fmt = PromptFormat()
    if record is not None:
        fmt = PromptFormat.from_record(record["prompt_format"], str(folder / SERVING_RECORD))
        if record["sid_index_fingerprint"] != index.fingerprint():
            raise ValueError(
                f"the merged model in the {where} was saved with SID index {record['sid_index_fingerprint']}, "
                f"not this one ({index.fingerprint()}): its SID tokens carry other items' codes; use the index "
                "saved with it"
            )
        if sid_softmax is None:
            sid_softmax = record["sid_token_ids"] or False
    else:
        warnings.warn(
            f"the {where} has no {SERVING_RECORD}: the default prompt format is used, which may not be the one "
            "the model was trained with (save merged models with GroundedRecommender.save_merged)",
            UserWarning,
            stacklevel=4,
        )
    tokenizer = AutoTokenizer.from_pretrained(folder)
    missing = [t for t in index.token_strings if t not in tokenizer.get_added_vocab()]
    if missing:
        raise ValueError(
            f"the merged model's tokenizer lacks {len(missing)} of the SID index's tokens (e.g. {missing[0]!r}): "
            "this index is not the one the model was merged with"
        )
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, use_safetensors=True)
    if record is not None and record["sid_token_ids"] and sid_softmax is not False:
        rows = set(record["sid_token_ids"])
        vocab = model.get_output_embeddings().weight.shape[0]
        outside = sorted(t for t in rows if t >= vocab)
        lacking = [t for t in tokenizer.convert_tokens_to_ids(index.token_strings) if t not in rows]
        if outside or lacking:
            what = (
                f"names token ids beyond the model's {vocab} output rows (e.g. {outside[0]})"
                if outside
                else f"lacks {len(lacking)} of the SID index's tokens (e.g. id {lacking[0]})"
            )
            raise ValueError(
                f"{folder / SERVING_RECORD}: sid_token_ids {what}, so it is not this model's record; write the "
                "folder again with GroundedRecommender.save_merged"
            )
    return model, tokenizer, index, fmt, sid_softmax


def read_serving_record(folder: Path, where: str) -> dict[str, Any] | None:
    """A merged folder's ``grounded_serving.json``, checked field by field (``None`` when absent)."""
    from .._io import read_json

    path = folder / SERVING_RECORD
    if not path.is_file():
        return None
    fix = f"write the folder again with GroundedRecommender.save_merged, or delete {SERVING_RECORD}"
    record = read_json(path, fix=fix)
    if not isinstance(record, dict):
        raise ValueError(f"{path} holds a JSON {type(record).__name__}, not a serving record; {fix}")
    missing = [name for name in SERVING_FIELDS if name not in record]
    extra = [name for name in record if name not in SERVING_FIELDS]
    if missing or extra:
        raise ValueError(f"{path}: missing fields {missing}, unknown fields {extra}; {fix}")
    for name, kind in SERVING_FIELDS.items():
        if isinstance(record[name], bool) or not isinstance(record[name], kind):
            raise ValueError(f"{path}: field {name!r} is {record[name]!r}, of the wrong type; {fix}")
    if record["format"] != SERVING_FORMAT:
        raise ValueError(f"{path} is of format {record['format']}, not {SERVING_FORMAT}; {fix}")
    rows = record["sid_token_ids"]
    if rows is not None and (
        not rows or any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in rows)
    ):
        raise ValueError(f"{path}: sid_token_ids must be a non-empty list of token ids or null; {fix}")
    return record


def decoding_rows(model: Any, tokenizer: Any, index: Any, trie: Any, sid_softmax: SIDSoftmax) -> Any:
    """The sorted token ids each decoding step of ``model`` normalises over, or ``False`` for the whole
    vocabulary (see :class:`GroundedRecommender`); checked to cover every SID token of ``trie``."""
    import torch

    from ..decoding.heads import StepHead, sid_rows

    grounded = hasattr(getattr(model, "base_model", None), "grounded_token_ids")
    if sid_softmax is None and not grounded:
        raise ValueError(
            "this model carries no grounded adapter, so how it was trained to normalise each SID step is "
            "unknown: pass sid_softmax=True (the SID-only softmax, sft's default), False (the whole vocabulary) "
            "or the SID rows' token ids. GroundedRecommender.from_pretrained reads it from the adapter"
        )
    if sid_softmax is True and not grounded:
        rows: torch.Tensor | None = torch.tensor(
            sorted(tokenizer.convert_tokens_to_ids(index.token_strings)), dtype=torch.long
        )
    else:
        rows = sid_rows(model, sid_softmax)
    if rows is None:
        return False
    vocab = model.get_output_embeddings().weight.shape[0]
    if int(rows.max()) >= vocab:
        raise ValueError(
            f"sid_softmax names token id {int(rows.max())}, beyond the model's {vocab} output rows: pass the "
            "SID rows of this model (or load it with the record saved beside it)"
        )
    StepHead(model, rows).check(trie)
    return rows


# Users' histories as the recommender takes them: checked against the SID index, read from JSONL.
#
# A histories file holds one JSON object per line, ``{"user": "u1", "history": ["item", ...]}`` (items oldest
# first); the same file, with each user's newest interaction last, fits the new-item rule
# (``--interactions``).


class HistoryInputError(ValueError):
    """A history the recommender cannot serve; the message names the users, the items and the fix."""


@dataclass
class CheckedHistories:
    """Histories with the items the index lacks removed (``skip_unknown=True``), and what was removed."""

    histories: list[list[str]]
    unknown: list[list[str]]

    @property
    def skipped(self) -> int:
        return sum(len(u) for u in self.unknown)


def check_histories(
    histories: Sequence[Sequence[Any]],
    index: Any,
    *,
    skip_unknown: bool = False,
    users: Sequence[str] | None = None,
) -> CheckedHistories:
    """Refuse empty histories, and items the index does not hold (named) unless ``skip_unknown``, which
    drops them and counts them; a history of only unknown items is refused either way."""
    if isinstance(histories, (str, bytes)) or (histories and isinstance(histories[0], (str, bytes, int))):
        raise HistoryInputError(
            "histories is a list of histories (one list of item ids per user); for one user pass [history]"
        )
    names = check_user_names(users, len(histories))
    kept, unknown = [], []
    for name, history in zip(names, histories, strict=True):
        if isinstance(history, (str, bytes)) or not isinstance(history, (list, tuple)):
            raise HistoryInputError(
                f"user {name}: the history is {_short(history)}, not a list of item ids; give [ITEM, ...]"
            )
        bad = [i for i in history if not is_item_id(i)]
        if bad:
            raise HistoryInputError(
                f"user {name}: history entries {[_short(b) for b in bad[:3]]} are not item ids (strings or "
                "integers); give each item's id"
            )
        items = [str(i) for i in history]
        if not items:
            raise HistoryInputError(
                f"user {name} has an empty history: the model recommends from what a user did; leave such users "
                "out (a popularity list is the usual answer for them)"
            )
        missing = [i for i in items if i not in index]
        if missing and not skip_unknown:
            raise HistoryInputError(
                f"user {name}: items {missing[:5]} are not in the SID index ({index.n_items} items); check the ids, "
                "add new items with `peft-grounded add-items` + `grow-adapter`, or skip unknown items "
                "(skip_unknown=True, --skip_unknown)"
            )
        if len(missing) == len(items):
            raise HistoryInputError(
                f"user {name}: none of the {len(items)} history items is in the SID index (e.g. {missing[:3]}); "
                "with nothing known there is nothing to recommend from: check that the ids are this catalogue's"
            )
        kept.append([i for i in items if i in index])
        unknown.append(missing)
    return CheckedHistories(kept, unknown)


def is_item_id(value: Any) -> bool:
    """Item and user ids are strings or integers (JSON's ``true``, ``null``, lists and objects are not)."""
    return not isinstance(value, bool) and isinstance(value, (str, int)) and str(value).strip() != ""


def check_user_names(users: Sequence[Any] | None, n: int) -> list[str]:
    """``users`` as strings (default ``#0``, ``#1``, ...): one per history, each an id, none twice."""
    if users is None:
        return [f"#{u}" for u in range(n)]
    if isinstance(users, (str, bytes)):
        raise HistoryInputError(f"users={users!r} is one string: give one name per history, in a list")
    users = list(users)
    if len(users) != n:
        raise HistoryInputError(f"{len(users)} user names for {n} histories: give one per history")
    bad = [u for u in users if not is_item_id(u)]
    if bad:
        raise HistoryInputError(
            f"user names {[_short(b) for b in bad[:3]]} are not ids (strings or integers)"
        )
    names = [str(u) for u in users]
    twice = sorted({u for u in names if names.count(u) > 1})
    if twice:
        raise HistoryInputError(f"users {twice[:5]} appear more than once: give one history per user")
    return names


def _short(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (dict, list, bool, type(None))) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def parse_history(text: str) -> list[str]:
    """``"1,2,3"`` -> ``["1", "2", "3"]`` (the command line's ``--history``); an empty or blank item is
    refused, naming its place."""
    parts = [part.strip() for part in text.split(",")]
    if not any(parts):
        raise HistoryInputError(
            "--history is empty: give the user's item ids, oldest first, comma-separated (e.g. --history 1,50,181)"
        )
    blank = [n for n, part in enumerate(parts, 1) if not part]
    if blank:
        raise HistoryInputError(
            f"--history {text!r} has an empty item at place {blank[0]}: give item ids separated by single commas"
        )
    return parts


def read_histories(path: str | Path) -> tuple[list[str], list[list[str]]]:
    """``(users, histories)`` from a JSONL file of ``{"user": ..., "history": [...]}`` lines."""
    path = Path(path)
    if not path.is_file():
        what = "a folder" if path.is_dir() else "not there"
        raise HistoryInputError(f"{path} is {what}: give a JSONL file of users")
    users, histories, seen = [], [], set()
    try:  # utf-8-sig: a byte-order mark (as some Windows editors write) is not part of the first line
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as err:
        raise HistoryInputError(
            f"{path} is not UTF-8 text ({err.reason} at byte {err.start}); write JSONL"
        ) from None
    # lines end at "\n" only: str.splitlines() would also break a JSON string holding U+2028 or U+0085
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        where = f"{path}, line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise HistoryInputError(
                f"{where} is not JSON ({err.msg}); write one JSON object per line"
            ) from None
        if not isinstance(record, dict) or not {"user", "history"} <= set(record):
            got = (
                f"fields {sorted(record)}" if isinstance(record, dict) else f"a JSON {type(record).__name__}"
            )
            raise HistoryInputError(f'{where}: expected {{"user": ID, "history": [ITEM, ...]}}, got {got}')
        if not is_item_id(record["user"]):
            raise HistoryInputError(
                f'{where}: "user" is {_short(record["user"])}; a user id is a string or an integer'
            )
        history = record["history"]
        if not isinstance(history, list):
            raise HistoryInputError(f'{where}: "history" is {_short(history)}, not a list of item ids')
        bad = [i for i in history if not is_item_id(i)]
        if bad:
            raise HistoryInputError(
                f'{where}: "history" holds {[_short(b) for b in bad[:3]]}; item ids are strings or integers'
            )
        user = str(record["user"])
        if user in seen:
            raise HistoryInputError(f"{where}: user {user!r} appears twice; give one line per user")
        seen.add(user)
        users.append(user)
        histories.append([str(i) for i in history])
    if not users:
        raise HistoryInputError(f"{path} holds no users; write one JSON line per user")
    return users, histories
