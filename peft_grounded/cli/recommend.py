"""``peft-grounded recommend``: the top-K items for users' histories with a trained adapter
(:class:`peft_grounded.serving.GroundedRecommender`).

One history (``--history 1,2,3``) prints a readable list; a JSONL file of users (``--histories users.jsonl``,
``{"user": ..., "history": [...]}`` per line) writes ``OUTPUT_DIR/recommendations.jsonl``, one line per user,
with a progress bar. Every input is checked before the first file is written. That run resumes: finished
users are kept in ``recommendations.jsonl.partial`` (a torn last line is dropped), and a rerun with the same
settings reuses a user's line only when its ``key`` (the sha256 of the settings, the user and the history)
matches; the final file appears complete or not at all. A folder holding results without their settings
record is refused, its files untouched. The flags are the fields of :class:`RecommendArguments`, parsed by TRL's parser; ``--config
recommend.yaml`` gives any of them.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .common import Command, catalogue_field

NAME = "recommend"
HELP = "recommend the top-K items for a history (or a JSONL file of users) with a trained adapter"
DESCRIPTION = (
    "Loads the adapter (a folder or a Hub repo id), its base model, its SID index and prompt format, and the "
    "new-item rule stored with it, then decodes each user's top-K items by SID-constrained beam search. "
    "--history ID,ID,... prints a list; --histories users.jsonl writes OUTPUT_DIR/recommendations.jsonl "
    "(resumable). Every flag is a field of RecommendArguments; --config FILE.yaml sets any of them."
)
OUTPUT = "recommendations.jsonl"
SETTINGS = "recommendations.settings.json"


@dataclass
class RecommendArguments:
    """What to load, whom to recommend for, and where the lists go."""

    adapter: str = field(
        metadata={
            "help": "Adapter folder (e.g. OUTPUT_DIR/adapter of `sft`), merged model folder, or Hub repo id."
        }
    )
    sid_index: str | None = field(
        default=None,
        metadata={"help": "SID index folder; None: the adapter's own sid_index/."},
    )
    history: str | None = field(
        default=None, metadata={"help": "One user's history: item ids, oldest first, comma-separated."}
    )
    histories: str | None = field(
        default=None,
        metadata={
            "help": 'JSONL file, one {"user": ID, "history": [ITEM, ...]} per line (needs --output_dir).'
        },
    )
    k: int = field(default=10, metadata={"help": "Items per user."})
    output_dir: str | None = field(default=None, metadata={"help": f"Folder for {OUTPUT} (resumable)."})
    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Base model; None: the one the adapter records."},
    )
    catalogue: str | None = catalogue_field(
        "For the items' titles (served without them when the index's own is not at hand). "
    )
    interactions: str | None = field(
        default=None,
        metadata={
            "help": "JSONL of histories logged since training (newest item last): fit the new-item rule on it for "
            "this call (grow-adapter --interactions stores one with the adapter)."
        },
    )
    include_history: bool = field(
        default=False, metadata={"help": "Keep items the user already has in the list (default: left out)."}
    )
    skip_unknown: bool = field(
        default=False,
        metadata={"help": "Drop history items the SID index does not hold (counted) instead of failing."},
    )
    num_beams: int = field(default=20, metadata={"help": "Beam width (at least k)."})
    decode_batch_size: int = field(default=32, metadata={"help": "Users per decoding batch."})
    device: str | None = field(
        default=None, metadata={"help": "torch device; None: cuda when available, else cpu."}
    )
    dtype: Literal["auto", "float32", "bfloat16"] = field(
        default="auto",
        metadata={"help": "Weights' dtype; auto: bf16 on a GPU that has it, float32 on a CPU."},
    )
    revision: str | None = field(default=None, metadata={"help": "Hub revision of the adapter repo."})
    sid_softmax: bool | None = field(
        default=None,
        metadata={
            "help": "How each SID step normalises: None reads it from the adapter (or a merged folder's "
            "grounded_serving.json); true: over the SID rows (sft's default), false: the whole vocabulary. "
            "A merged folder without grounded_serving.json needs it."
        },
    )

    def __post_init__(self) -> None:
        if (self.history is None) == (self.histories is None):
            raise ValueError("give one of --history ID,ID,... (one user) or --histories users.jsonl (many)")
        if self.histories is not None and self.output_dir is None:
            raise ValueError(f"--histories writes {OUTPUT}: pass --output_dir DIR")
        for flag in ("k", "num_beams", "decode_batch_size"):
            if getattr(self, flag) < 1:
                raise ValueError(f"--{flag} must be >= 1, got {getattr(self, flag)}")

    def settings(self) -> dict[str, Any]:
        """What a resumed run must share with the one it continues."""
        keys = (
            "adapter",
            "sid_index",
            "k",
            "model_name_or_path",
            "interactions",
            "include_history",
            "skip_unknown",
            "num_beams",
            "dtype",
            "revision",
            "sid_softmax",
        )
        return {key: getattr(self, key) for key in keys}


def run(args: RecommendArguments) -> int:
    """Recommend as the arguments say; ``--output_dir`` is locked while the command runs."""
    from contextlib import nullcontext

    from .._io import output_lock

    if args.output_dir:
        _check_output_dir(Path(args.output_dir))  # before the lock, which is made beside the folder
    with output_lock(args.output_dir, NAME) if args.output_dir else nullcontext():
        return _run(args)


def _check_output_dir(out: Path) -> None:
    """Refuse an output folder that is a file or a link, lies under a file, or cannot be written."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ValueError(
            f"--output_dir {out} is {'a link' if out.is_symlink() else 'a file'}; choose a folder"
        )
    existing = out if out.exists() else next(p for p in out.absolute().parents if p.exists())
    if not existing.is_dir():
        raise ValueError(
            f"--output_dir {out}: {existing} is a file, so no folder can be made there; choose a folder"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        reason = _write_problem(existing)
        if reason is not None:
            raise PermissionError(
                f"--output_dir {out}: {existing} is not writable ({reason}); choose a folder you can write"
            )


def _write_problem(folder: Path) -> str | None:
    """Why no file can be made in ``folder``, in the system's words ("Permission denied", "Read-only file
    system"), or None when one can (the probe file is removed at once)."""
    import tempfile

    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=".peft_grounded-probe-")
    except OSError as err:
        return err.strerror or str(err)
    os.close(fd)
    os.unlink(name)
    return None


def _run(args: RecommendArguments) -> int:
    from ..serving import GroundedRecommender, read_histories
    from ..serving.loading import parse_history

    users, histories = (
        (["history"], [parse_history(args.history)])
        if args.history is not None
        else read_histories(args.histories)
    )
    out = Path(args.output_dir) if args.output_dir else None
    done: dict[str, dict[str, Any]] = {}
    if out is not None:  # checked before anything loads; nothing is written until every input is checked
        done = _resume(out, args)
    _check_model_files(args)
    recommender = GroundedRecommender.from_pretrained(
        args.adapter,
        sid_index=args.sid_index,
        model_name_or_path=args.model_name_or_path,
        catalogue=args.catalogue,
        revision=args.revision,
        device=args.device,
        dtype=args.dtype,
        num_beams=args.num_beams,
        batch_size=args.decode_batch_size,
        sid_softmax=args.sid_softmax,
    )
    if recommender.peer_fusion is not None:
        print(recommender.peer_fusion.describe(), file=sys.stderr)
    if args.interactions:
        rule = recommender.fit_new_items(read_histories(args.interactions)[1])
        print(rule.describe(), file=sys.stderr)
    options = dict(k=args.k, exclude_history=not args.include_history, skip_unknown=args.skip_unknown)
    recommender.check_request(histories, args.k, users=users, skip_unknown=args.skip_unknown)  # all, first
    if out is None:
        (result,) = recommender.recommend(histories, users=users, **options)
        _print_one(result)
        return 0
    lines = _run_file(recommender, users, histories, done, out, args, options)
    if args.history is not None:
        _print_one(_from_line(lines[0]))
    return 0


def _check_model_files(args: RecommendArguments) -> None:
    """Refuse, naming the flag, a ``--model_name_or_path`` path that is not there (else taken for a Hub id)
    and a local merged folder that cannot say how it decodes (no record, no ``--sid_softmax``)."""
    from ..hub.repo import ADAPTER_CONFIG
    from ..serving.loading import SERVING_RECORD

    model = args.model_name_or_path
    if model is not None and (model.startswith((".", "/", "~")) or Path(model).expanduser().exists()):
        from ..sids.extended_base import check_model_dir

        check_model_dir(model, "--model_name_or_path")
    folder = Path(args.adapter).expanduser()
    merged = folder.is_dir() and not (folder / ADAPTER_CONFIG).exists() and (folder / "config.json").is_file()
    if merged and args.sid_softmax is None and not (folder / SERVING_RECORD).exists():
        raise ValueError(
            f"--adapter {folder} is a merged model without {SERVING_RECORD} (which GroundedRecommender."
            "save_merged writes), so how it was trained to normalise each SID step is unknown and a guess serves "
            "other lists: pass --sid_softmax true (over the SID rows, sft's default) or --sid_softmax false (the "
            "whole vocabulary), as it was trained"
        )


def _print_one(result: Any) -> None:
    print(result.table())
    if result.skipped:
        print(f"skipped {len(result.skipped)} unknown history items: {result.skipped[:10]}", file=sys.stderr)


def _from_line(line: str) -> Any:
    from ..serving import UserRecommendations

    record = json.loads(line)
    record.pop(KEY)
    return UserRecommendations(**record)


KEY = "key"  # each line's sha256 of the settings, the user and the history it was decoded from


def request_key(settings: dict[str, Any], user: str, history: Sequence[str]) -> str:
    """What a finished line must have been decoded from to be kept by a resumed run."""
    import hashlib

    text = json.dumps([settings, user, list(history)], sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _resume(out: Path, args: RecommendArguments) -> dict[str, dict[str, Any]]:
    """The lines already written (final and partial file) by user, after checking that the folder is this
    command's and holds these settings (:func:`run` checked that it can be written). A line is reused only
    when its key matches (see :func:`request_key`)."""
    from .._io import read_json

    settings = out / SETTINGS
    ours = [out / OUTPUT, out / (OUTPUT + ".partial")]
    if not settings.is_file():
        found = [p.name for p in ours if p.exists() or p.is_symlink()]
        if found:
            raise ValueError(
                f"{out} holds {', '.join(found)} but no {SETTINGS}: they were not written by this command, or "
                f"their settings are lost, so nothing says what they hold. Choose another --output_dir, or delete "
                f"{', '.join(found)} there to start over (nothing was changed)"
            )
        return {}
    start_over = f"delete {OUTPUT}* and {SETTINGS} in {out} to start over"
    recorded = read_json(settings, fix=start_over)
    if not isinstance(recorded, dict):
        raise ValueError(
            f"{settings} holds a JSON {type(recorded).__name__}, not this command's settings; {start_over}"
        )
    now = args.settings()
    if recorded != now:
        changed = [key for key in {**recorded, **now} if recorded.get(key, "unset") != now.get(key, "unset")]
        said = ", ".join(
            f"{key} {recorded.get(key, 'unset')!r} then, {now.get(key, 'unset')!r} now" for key in changed
        )
        raise ValueError(
            f"{out} holds recommendations made with other settings ({said}); choose another --output_dir, "
            f"or {start_over} (nothing was changed)"
        )
    done: dict[str, dict[str, Any]] = {}
    for path in ours:
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise ValueError(f"{path} is not a plain file; delete it to start over (nothing was changed)")
        if not path.is_file():
            continue
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True):
            if not line.endswith("\n"):
                break  # torn by an interrupted write: decoded again
            try:
                record = json.loads(line)
                done[str(record["user"])] = {"key": record[KEY], "line": line}
            except (json.JSONDecodeError, KeyError, TypeError):
                break
    return done


def _run_file(
    recommender: Any,
    users: list[str],
    histories: list[list[str]],
    done: dict[str, dict[str, Any]],
    out: Path,
    args: RecommendArguments,
    options: dict[str, Any],
) -> list[str]:
    """Decode the users whose finished line does not match their request, keep the rest; returns the lines."""
    from tqdm.auto import tqdm

    from .._io import atomic_write_text

    settings = args.settings()
    keys = [request_key(settings, user, history) for user, history in zip(users, histories, strict=True)]
    lines = {
        user: done[user]["line"]
        for user, key in zip(users, keys, strict=True)
        if user in done and done[user]["key"] == key
    }
    todo = [u for u, user in enumerate(users) if user not in lines]
    skipped = 0
    out.mkdir(parents=True, exist_ok=True)
    partial = out / (OUTPUT + ".partial")
    atomic_write_text(out / SETTINGS, json.dumps(settings, indent=1) + "\n")
    with tqdm(total=len(users), initial=len(users) - len(todo), desc="recommend", unit="user") as bar:
        # a partial file holds complete lines only: rewrite it from what was kept before appending
        atomic_write_text(partial, "".join(lines.values()))
        with partial.open("a", encoding="utf-8") as handle:
            for start in range(0, len(todo), args.decode_batch_size):
                chunk = todo[start : start + args.decode_batch_size]
                results = recommender.recommend(
                    [histories[u] for u in chunk], users=[users[u] for u in chunk], **options
                )
                for u, result in zip(chunk, results, strict=True):
                    lines[result.user] = json.dumps(result.to_dict() | {KEY: keys[u]}) + "\n"
                    skipped += len(result.skipped)
                handle.write("".join(lines[users[u]] for u in chunk))
                handle.flush()
                os.fsync(handle.fileno())
                bar.update(len(chunk))
    atomic_write_text(out / OUTPUT, "".join(lines[user] for user in users))
    partial.unlink(missing_ok=True)
    note = f"; skipped {skipped} unknown history items" if skipped else ""
    print(f"{len(users)} users ({len(todo)} decoded now) -> {out / OUTPUT}{note}", file=sys.stderr)
    return [lines[user] for user in users]


def settings() -> tuple[type, ...]:
    return (RecommendArguments,)


COMMAND = Command(
    name=NAME,
    help=HELP,
    description=DESCRIPTION,
    settings=settings,
    run=run,
)


parser = COMMAND.parser


def parse(argv: Sequence[str]) -> RecommendArguments:
    """:class:`RecommendArguments` from command-line arguments (and ``--config FILE.yaml``)."""
    (args,) = COMMAND.parse(argv)
    return args


def main(argv: Sequence[str]) -> int:
    return COMMAND.main(argv)
