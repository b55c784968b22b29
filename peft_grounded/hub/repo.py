"""Where a grounded adapter lives (a Hub repo or a local folder), what it must hold, and safe fetching.

A grounded-adapter repo holds, at its root, ``adapter_config.json`` (a ``GROUNDED_TOKENS`` PEFT config
that also lists the new tokens, the base vocabulary's size and fingerprint, and the base embedding's
signature) and ``adapter_model.safetensors`` (the new tokens' rows, and a LoRA if one was stacked).
Pickled weights (``*.bin``, ``*.pt``, ...) are never fetched nor loaded.

:func:`check_index_version` (below): the SID index next to an adapter must be the version the adapter was
trained or grown on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..adapter.saved import ADAPTER_CONFIG, ADAPTER_WEIGHTS, GROUNDED_TOKENS

if TYPE_CHECKING:
    from ..sids.index import SIDIndex


SID_INDEX_DIR = "sid_index"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
# What `pull` fetches: configs, tokenizer files, safetensors, the card. Never pickles or code.
# a peer fusion stored with an adapter (serving.peer_fusion): its record first, then the SASRec peer's two files
FUSION_FILES = ("peer_fusion.json", "sasrec.json", "sasrec.safetensors")
# the new-item rule stored with an adapter (new_items.rule): its record, then its vectors
RULE_FILES = ("new_item_rule.json", "new_item_rule.safetensors")
SAFE_PATTERNS = ("*.json", "*.safetensors", "*.md", "*.txt", "*.jinja")


class GroundedHubError(ValueError):
    """A repo or folder without a usable grounded adapter, or one that does not fit the given base."""


def check_repo_id(repo_id: Any) -> str:
    """Return ``repo_id`` if it is a valid Hub model repo id (``name`` or ``namespace/name``), else raise."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if not isinstance(repo_id, str):
        raise GroundedHubError(
            f"A Hub repo id is a string like 'user/sid-adapter', got {type(repo_id).__name__}."
        )
    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        raise GroundedHubError(
            f"{repo_id!r} is not a valid Hub repo id ({err}). Use 'namespace/name' with letters, digits, "
            "'-', '_' and '.' (no '--' or '..', at most 96 characters)."
        ) from None
    return repo_id


@dataclass(frozen=True)
class Source:
    """A local folder, or a Hub repo resolved to one commit; ``files`` lists its paths (``a/b.json``)."""

    files: tuple[str, ...]
    folder: Path | None = None
    repo_id: str | None = None
    commit: str | None = None
    token: str | bool | None = field(default=None, repr=False)

    @property
    def where(self) -> str:
        return f"Hub repo {self.repo_id!r}" if self.repo_id else f"folder {str(self.folder)!r}"

    def fetch(self, patterns: Sequence[str], local_dir: str | Path | None = None) -> Path:
        """A local folder holding (at least) the files matching ``patterns``: the folder itself, or a
        download of the resolved commit to the Hub cache (or ``local_dir``)."""
        if self.folder is not None:
            return self.folder
        from huggingface_hub import snapshot_download

        folder = snapshot_download(
            self.repo_id,
            revision=self.commit,
            allow_patterns=list(patterns),
            token=self.token,
            local_dir=local_dir,
        )
        return Path(folder)


def check_adapter_files(files: list[str], where: str) -> None:
    """Raise unless ``files`` (paths relative to the repo root) hold a safetensors adapter at the root."""
    if ADAPTER_CONFIG not in files:
        nested = sorted(f for f in files if f.endswith("/" + ADAPTER_CONFIG))
        hint = (
            f" Adapters in subfolders ({', '.join(nested[:3])}) are not supported: push the adapter to the root."
            if nested
            else " Push one with peft_grounded.hub.push_grounded."
        )
        raise GroundedHubError(
            f"The {where} holds no adapter: there is no {ADAPTER_CONFIG} at its root.{hint}"
        )
    if ADAPTER_WEIGHTS not in files:
        pickled = sorted(f for f in files if "/" not in f and f.endswith(PICKLE_SUFFIXES))
        if pickled:
            raise GroundedHubError(
                f"The {where} holds only pickled adapter weights ({', '.join(pickled)}); peft_grounded loads "
                f"safetensors only. Re-save the adapter with save_pretrained(..., safe_serialization=True) and push "
                "it again."
            )
        raise GroundedHubError(f"The {where} has {ADAPTER_CONFIG} but no {ADAPTER_WEIGHTS}.")


def load_grounded_config(folder: Path, where: str):
    """The folder's :class:`~peft_grounded.GroundedTokenConfig`, its ``adapter_config.json`` parsed once;
    raises if it is another kind of adapter, or a field is missing, unknown or mistyped. Pass the result
    on (to :func:`~peft_grounded.hub.load.attach_grounded`, ``check_index_version``) rather than reading
    the file again."""
    import warnings

    from ..adapter import GroundedTokenConfig
    from ..adapter.saved import adapter_config_json

    fix = "save the adapter again (save_pretrained), or restore (or pull) a good copy"
    try:
        raw = adapter_config_json(folder, fix=fix)  # a bad file is named with the place: "line 4, column 25"
    except (OSError, ValueError) as err:
        raise GroundedHubError(f"The {where} has an unreadable {ADAPTER_CONFIG}: {err}") from None
    peft_type = raw.get("peft_type") if isinstance(raw, dict) else None
    if peft_type != GROUNDED_TOKENS:
        raise GroundedHubError(
            f"The {where} holds a {peft_type or 'non-PEFT'} adapter, not a grounded-token adapter "
            f"(peft_type {GROUNDED_TOKENS.value}); load it with peft.PeftModel.from_pretrained instead."
        )
    known = {f.name for f in fields(GroundedTokenConfig)}
    missing = [name for name in ("token_indices",) if name not in raw]
    extra = sorted(name for name in raw if name not in known)
    if missing or extra:
        raise GroundedHubError(
            f"The {where}'s {ADAPTER_CONFIG} has missing fields {missing}, unknown fields {extra}; {fix}"
        )
    for name in ("lora", "provenance", "runtime_config"):
        if raw.get(name) is not None and not isinstance(raw[name], dict):
            raise GroundedHubError(
                f"The {where}'s {ADAPTER_CONFIG}: field {name!r} is {raw[name]!r:.60}, not an object; {fix}"
            )
    if "runtime_config" in raw:  # as PeftConfig.from_pretrained does
        warnings.warn(
            "The configuration file contains a `runtime_config` key. This is ignored. Runtime configurations "
            "are only valid at runtime.",
            stacklevel=2,
        )
    kwargs = {name: value for name, value in raw.items() if name != "runtime_config"}
    config = GroundedTokenConfig.from_peft_type(**GroundedTokenConfig.check_kwargs(**kwargs))
    config.runtime_config.rows_from_checkpoint = True  # as GroundedTokenConfig.from_pretrained
    return config


def _resolve_commit(repo_id: str, revision: str | None, token: str | bool | None) -> tuple[str, list[str]]:
    """The commit ``revision`` points at, and the files of the repo there (one request)."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    try:
        info = HfApi().model_info(repo_id, revision=revision, token=token)
    except RevisionNotFoundError:
        raise GroundedHubError(f"The Hub repo {repo_id!r} has no revision {revision!r}.") from None
    except RepositoryNotFoundError:
        raise GroundedHubError(
            f"No model repo {repo_id!r} on {constants.ENDPOINT} (or it is private or gated: pass token=..., "
            "or log in with `hf auth login`). Check the id; a local folder must exist to be read as one."
        ) from None
    return info.sha, [s.rfilename for s in info.siblings or []]


def open_source(
    repo_id_or_path: str | Path, *, revision: str | None = None, token: str | bool | None = None
) -> Source:
    """Resolve a local folder or a Hub repo id (at ``revision``) and list its files; downloads nothing."""
    path = Path(repo_id_or_path).expanduser()
    if path.is_dir():
        if revision is not None:
            raise GroundedHubError(
                f"revision={revision!r} applies to Hub repos; {str(path)!r} is a local folder."
            )
        files = sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file())
        return Source(tuple(files), folder=path)
    if path.exists():
        raise GroundedHubError(f"{str(path)!r} is a file; give the adapter's folder or a Hub repo id.")
    repo_id = str(repo_id_or_path)
    if repo_id.startswith((".", "/", "~")) or "\\" in repo_id:
        raise GroundedHubError(f"No folder {repo_id!r}; a Hub repo id looks like 'namespace/name'.")
    check_repo_id(repo_id)
    commit, files = _resolve_commit(repo_id, revision, token)
    return Source(tuple(files), repo_id=repo_id, commit=commit, token=token)


def fetch_adapter(
    repo_id_or_path: str | Path, *, revision: str | None = None, token: str | bool | None = None
):
    """Check that ``repo_id_or_path`` holds a safetensors grounded adapter and fetch its config, weights and SID
    record only.

    A Hub repo is checked from its file list, then its config, before the weights are downloaded. Returns
    ``(source, folder, config)``.
    """
    source = open_source(repo_id_or_path, revision=revision, token=token)
    check_adapter_files(list(source.files), source.where)
    config = load_grounded_config(source.fetch((ADAPTER_CONFIG,)), source.where)
    from ..sids.extended_base import SID_RECORD

    wanted = (ADAPTER_CONFIG, ADAPTER_WEIGHTS, *((SID_RECORD,) if SID_RECORD in source.files else ()))
    return source, source.fetch(wanted), config


# The SID index next to an adapter must be the version the adapter was trained or grown on.


def check_index_version(recorded: str | None, index: SIDIndex, where: str) -> None:
    """Raise :class:`GroundedHubError` unless ``index`` is the version (fingerprint ``recorded``, from the
    adapter's SID record) the adapter was trained or grown on."""
    actual = index.fingerprint()
    if recorded is None or recorded == actual:
        return
    if recorded in index.lineage:
        why = (
            f"the adapter belongs to a parent version ({recorded}) of this index ({actual}, {index.n_items} "
            "items): grow the adapter onto it (peft_grounded.new_items.grow_adapter) or use the parent index"
        )
    elif index.parent is not None or index.lineage:
        why = (
            f"the adapter belongs to index version {recorded}, not to this one ({actual}, grown from "
            f"{index.parent}): push the index the adapter was grown onto"
        )
    else:
        why = (
            f"the adapter belongs to SID index {recorded}, this index is {actual}: another build, or a parent "
            "version (an adapter grown with grow_adapter belongs to the grown index: push that one)"
        )
    raise GroundedHubError(f"The SID index of the {where} does not match its adapter: {why}.")
