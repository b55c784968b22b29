"""A loopback Hugging Face Hub for tests (stdlib only).

It speaks the part of the Hub HTTP API that the real ``huggingface_hub`` 2.x client uses to push
and pull a repo, so tests can run ``create_repo``/``upload_folder``/``create_commit``,
``hf_hub_download``/``snapshot_download``, ``model_info``/``list_repo_files``/``list_repo_refs``,
``create_branch``/``create_tag``, and the ``from_pretrained``/``push_to_hub`` of transformers and
PEFT, against ``HF_ENDPOINT=<server.url>`` without the internet.

Transfers stay plain HTTP whatever the client has installed:

- upload: ``preupload`` answers ``"regular"`` for every file by default, so contents travel
  base64-encoded inside the commit payload and the client never opens a Xet (or LFS) session.
  With ``HubServer(lfs=True)`` weight-like files (``*.safetensors``, ...) and files of 10 MB or
  more are ``"lfs"`` as on the real Hub and go through the legacy LFS batch API (basic transfer),
  which the client uses only when Xet is off (``HF_HUB_DISABLE_XET=1`` or ``hf_xet`` missing);
  the Xet token routes answer 501 with a message saying so.
- download: file responses never carry ``X-Xet-Hash``, so ``hf_hub_download`` uses HTTP GET.

Any token is accepted. Repos live in memory, file contents on disk (content-addressed). Not
served: pull requests/discussions, Xet, pagination (listings come in one page), single-segment
repo ids (``gpt2``): repos are ``namespace/name``.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import re
import shutil
import socket
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

TYPE_SEGMENTS = {"models": "model", "datasets": "dataset", "spaces": "space"}
URL_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack", ".onnx", ".npy")
LFS_MIN_SIZE = 10 * 1024 * 1024
GITATTRIBUTES = "".join(f"*{s} filter=lfs diff=lfs merge=lfs -text\n" for s in LFS_SUFFIXES)
DEFAULT_BRANCH = "main"
COMMIT_RE = re.compile(r"[0-9a-f]{40}")
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}")


class HubError(Exception):
    """An HTTP error in the Hub's format (``X-Error-Code`` drives the client's exception class)."""

    def __init__(
        self, status: int, message: str, code: str | None = None, commit: str | None = None, **extra: Any
    ):
        super().__init__(message)
        self.status, self.message, self.code, self.commit, self.extra = status, message, code, commit, extra


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def git_blob_oid(data: bytes) -> str:
    """The git object id of a blob: what the Hub uses as ETag for non-LFS files."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass(frozen=True)
class Blob:
    sha256: str
    git_oid: str
    size: int
    lfs: bool

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.git_oid

    def tree_entry(self, path: str) -> dict[str, Any]:
        entry: dict[str, Any] = {"type": "file", "oid": self.git_oid, "size": self.size, "path": path}
        if self.lfs:
            entry["lfs"] = {"oid": self.sha256, "size": self.size, "pointerSize": 134}
        return entry


@dataclass
class Commit:
    oid: str
    parent: str | None
    title: str
    message: str
    date: str
    files: dict[str, Blob]


@dataclass
class Repo:
    repo_type: str
    repo_id: str
    private: bool
    created_at: str = field(default_factory=_now)
    uid: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    commits: dict[str, Commit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)

    def resolve(self, revision: str) -> Commit:
        oid = self.branches.get(revision) or self.tags.get(revision)
        if oid is None and COMMIT_RE.fullmatch(revision) and revision in self.commits:
            oid = revision
        if oid is None:
            raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return self.commits[oid]


class HubState:
    """Repos, refs and commits in memory; blobs on disk under ``root``. Thread-safe."""

    def __init__(self, root: Path, user: str = "user", lfs: bool = False):
        self.root, self.user, self.lfs = root, user, lfs
        (root / "blobs").mkdir(parents=True, exist_ok=True)
        self.repos: dict[tuple[str, str], Repo] = {}
        self.lock = threading.RLock()
        self._counter = 0

    # -- blobs ---------------------------------------------------------------------------------
    def blob_path(self, sha256: str) -> Path:
        return self.root / "blobs" / sha256

    def put_blob(self, data: bytes, lfs: bool) -> Blob:
        sha256 = hashlib.sha256(data).hexdigest()
        path = self.blob_path(sha256)
        if not path.exists():
            tmp = path.with_suffix(f".{uuid.uuid4().hex}.tmp")
            tmp.write_bytes(data)
            tmp.replace(path)
        return Blob(sha256, git_blob_oid(data), len(data), lfs)

    def lfs_blob(self, sha256: str) -> Blob | None:
        path = self.blob_path(sha256)
        if not re.fullmatch(r"[0-9a-f]{64}", sha256) or not path.exists():
            return None
        return Blob(sha256, git_blob_oid(path.read_bytes()), path.stat().st_size, True)

    # -- repos ---------------------------------------------------------------------------------
    def get(self, repo_type: str, repo_id: str) -> Repo:
        repo = self.repos.get((repo_type, repo_id))
        if repo is None:
            raise HubError(404, f"Repository Not Found for {repo_type}s/{repo_id}.", "RepoNotFound")
        return repo

    def create(self, repo_type: str, namespace: str | None, name: str, private: bool) -> Repo:
        namespace = namespace or self.user
        for part in (namespace, name):
            if not NAME_RE.fullmatch(part) or ".." in part or part.endswith(".git"):
                raise HubError(400, f"Invalid repo name: {namespace}/{name}", "BadRequest")
        repo_id = f"{namespace}/{name}"
        with self.lock:
            if (repo_type, repo_id) in self.repos:
                raise HubError(409, f"You already created this {repo_type} repo", url=repo_id)
            repo = Repo(repo_type, repo_id, private)
            first = self._new_commit(None, "initial commit", "", {})
            first.files[".gitattributes"] = self.put_blob(GITATTRIBUTES.encode(), lfs=False)
            repo.commits[first.oid] = first
            repo.branches[DEFAULT_BRANCH] = first.oid
            self.repos[(repo_type, repo_id)] = repo
            return repo

    def delete(self, repo_type: str, repo_id: str) -> None:
        with self.lock:
            self.get(repo_type, repo_id)
            del self.repos[(repo_type, repo_id)]

    def _new_commit(self, parent: Commit | None, title: str, message: str, files: dict[str, Blob]) -> Commit:
        self._counter += 1
        seed = f"{parent.oid if parent else ''}|{title}|{time.time_ns()}|{self._counter}|{sorted(files)}"
        oid = hashlib.sha1(seed.encode()).hexdigest()
        return Commit(oid, parent.oid if parent else None, title, message, _now(), dict(files))

    def upload_mode(self, path: str, size: int) -> str:
        if self.lfs and size > 0 and (path.endswith(LFS_SUFFIXES) or size >= LFS_MIN_SIZE):
            return "lfs"
        return "regular"

    def commit(self, repo: Repo, branch: str, ops: list[dict[str, Any]]) -> Commit:
        """Apply ndjson commit operations on ``branch`` (which must exist)."""
        with self.lock:
            if branch not in repo.branches:
                raise HubError(404, f"Invalid rev id: {branch}", "RevisionNotFound")
            head = repo.commits[repo.branches[branch]]
            files = dict(head.files)
            header: dict[str, Any] = {}
            for op in ops:
                key, value = op.get("key"), op.get("value", {})
                if key == "header":
                    header = value
                elif key == "file":
                    data = (
                        base64.b64decode(value["content"])
                        if value.get("encoding") == "base64"
                        else value["content"].encode()
                    )
                    files[value["path"]] = self.put_blob(data, lfs=False)
                elif key == "lfsFile":
                    blob = self.lfs_blob(value["oid"])
                    if blob is None:
                        raise HubError(422, f"LFS object {value['oid']} was not uploaded", "BadRequest")
                    files[value["path"]] = blob
                elif key == "deletedFile":
                    if files.pop(value["path"], None) is None:
                        raise HubError(404, "A file with this name doesn't exist", "EntryNotFound")
                elif key == "deletedFolder":
                    prefix = value["path"].rstrip("/") + "/"
                    for path in [p for p in files if p.startswith(prefix)]:
                        del files[path]
                else:
                    raise HubError(400, f"Unknown commit operation {key!r}", "BadRequest")
            parent = header.get("parentCommit")
            if parent is not None and parent != head.oid:
                raise HubError(
                    412, f"A commit has happened since {parent}; head is {head.oid}", "PreconditionFailed"
                )
            new = self._new_commit(head, header.get("summary", ""), header.get("description", ""), files)
            repo.commits[new.oid] = new
            repo.branches[branch] = new.oid
            return new


def _tree_entries(files: dict[str, Blob], directory: str, recursive: bool) -> list[dict[str, Any]]:
    """Tree listing of ``directory`` ('' = root), folders before files as on the Hub."""
    prefix = directory.strip("/") + "/" if directory.strip("/") else ""
    folders: set[str] = set()
    entries: list[dict[str, Any]] = []
    for path in sorted(p for p in files if p.startswith(prefix)):
        parts = path[len(prefix) :].split("/")
        depth = len(parts) if recursive else min(len(parts), 2)
        folders.update(prefix + "/".join(parts[:d]) for d in range(1, depth))
        if recursive or len(parts) == 1:
            entries.append(files[path].tree_entry(path))
    dirs = []
    for folder in sorted(folders):
        inside = sorted((p, b.git_oid) for p, b in files.items() if p.startswith(folder + "/"))
        oid = hashlib.sha1(repr(inside).encode()).hexdigest()  # content-derived, like a git tree id
        dirs.append({"type": "directory", "oid": oid, "size": 0, "path": folder})
    return dirs + entries


class HubRequestHandler(BaseHTTPRequestHandler):
    """Routes requests to ``self.server.state`` (see the module docstring for the API covered)."""

    protocol_version = "HTTP/1.1"
    server: HubHTTPServer
    timeout = 30  # idle keep-alive connections close after this

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # -- plumbing ------------------------------------------------------------------------------
    def do_GET(self) -> None:
        self._handle("GET")

    def do_HEAD(self) -> None:
        self._handle("HEAD")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    _recorded = False

    def send_response(self, code: int, message: str | None = None) -> None:
        """Record ``(method, path, status)`` before the client can read the response: a test that asserts
        on ``requests`` right after a call returns must find that call there."""
        self.server.requests.append((self.command, urlsplit(self.path).path, code))
        self._recorded = True
        super().send_response(code, message)

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        headers = {"Content-Type": "application/json", "Content-Length": str(len(body)), **(headers or {})}
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def _json(self, payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(payload).encode(), headers)

    def _handle(self, method: str) -> None:
        self._recorded = False  # one handler serves every request of a kept-alive connection
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.split("/")[1:]]
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        body = self._read_body()
        status = 500
        try:
            if parts and parts[0] == "api":
                self._api(method, parts[1:], query, body)
            elif parts and parts[0] == "__lfs__":
                self._lfs_object(method, parts[1:], body)
            else:
                self._files(method, parts, body)
            status = 200
        except HubError as err:
            status = err.status
            headers = {"X-Error-Code": err.code or "", "X-Error-Message": err.message}
            if err.commit:
                headers["X-Repo-Commit"] = err.commit
            self._json({"error": err.message, **err.extra}, err.status, headers)
        except Exception as err:  # a bug here must reach the test as a 500, not a hung client
            self._json({"error": f"{type(err).__name__}: {err}"}, 500, {"X-Error-Message": str(err)})
        finally:
            if not self._recorded:  # nothing was sent (a dropped connection): still on the record
                self.server.requests.append((method, url.path, status))

    @property
    def state(self) -> HubState:
        return self.server.state

    def _repo(self, repo_type: str, ns: str, name: str) -> Repo:
        return self.state.get(repo_type, f"{ns}/{name}")

    def _repo_url(self, repo: Repo) -> str:
        return f"{self.server.url}/{URL_PREFIX[repo.repo_type]}{repo.repo_id}"

    # -- /api/... ------------------------------------------------------------------------------
    def _api(self, method: str, parts: list[str], query: dict[str, str], body: bytes) -> None:
        state = self.state
        if parts == ["whoami-v2"]:
            return self._json(
                {
                    "type": "user",
                    "id": "0" * 24,
                    "name": state.user,
                    "fullname": state.user,
                    "orgs": [],
                    "auth": {
                        "type": "access_token",
                        "accessToken": {"displayName": "loopback", "role": "write"},
                    },
                }
            )
        if parts == ["validate-yaml"] and method == "POST":
            return self._json({"errors": [], "warnings": []})
        if parts[:1] == ["repos"] and method in ("POST", "DELETE"):
            payload = json.loads(body or b"{}")
            repo_type = payload.get("type") or "model"
            if parts[1:] == ["create"]:
                try:
                    repo = state.create(
                        repo_type, payload.get("organization"), payload["name"], payload.get("private")
                    )
                except HubError as err:
                    # The Hub says where the existing repo is (read by create_repo(exist_ok=True)).
                    if "url" in err.extra:
                        err.extra["url"] = f"{self.server.url}/{URL_PREFIX[repo_type]}{err.extra['url']}"
                    raise
                return self._json({"url": self._repo_url(repo), "name": repo.repo_id, "id": repo.uid})
            if parts[1:] == ["delete"]:  # DELETE with a JSON body
                ns = payload.get("organization") or state.user
                state.delete(repo_type, f"{ns}/{payload['name']}")
                return self._json({})
        if len(parts) >= 3 and parts[0] in TYPE_SEGMENTS:
            return self._repo_api(method, TYPE_SEGMENTS[parts[0]], parts[1], parts[2], parts[3:], query, body)
        raise HubError(404, f"{method} /api/{'/'.join(parts)} is not served by the loopback hub")

    def _repo_api(
        self,
        method: str,
        repo_type: str,
        ns: str,
        name: str,
        rest: list[str],
        query: dict[str, str],
        body: bytes,
    ) -> None:
        state = self.state
        repo = self._repo(repo_type, ns, name)
        action, arg = (rest[0], rest[1] if len(rest) > 1 else "") if rest else ("", "")
        with state.lock:
            if method == "GET" and (not rest or action == "revision"):
                return self._json(self._info(repo, repo.resolve(arg or DEFAULT_BRANCH)))
            if method == "GET" and action == "tree":
                commit = repo.resolve(arg)
                path = "/".join(rest[2:]).strip("/")
                if path and not any(p.startswith(path + "/") for p in commit.files):
                    raise HubError(404, f"{path} does not exist on {arg}", "EntryNotFound", commit.oid)
                recursive = query.get("recursive", "").lower() in ("1", "true")
                return self._json(_tree_entries(commit.files, path, recursive))
            if method == "POST" and action == "paths-info":
                commit = repo.resolve(arg)
                if self.headers.get("Content-Type", "").startswith("application/json"):
                    paths = json.loads(body).get("paths", [])
                else:
                    paths = parse_qs(body.decode()).get("paths", [])
                entries = _tree_entries(commit.files, "", recursive=True)
                wanted = {p.strip("/") for p in paths}
                return self._json([e for e in entries if e["path"] in wanted])
            if method == "GET" and action == "refs":

                def ref(kind: str, n: str, oid: str) -> dict[str, str]:
                    return {"name": n, "ref": f"refs/{kind}/{n}", "targetCommit": oid}

                return self._json(
                    {
                        "branches": [ref("heads", n, o) for n, o in repo.branches.items()],
                        "tags": [ref("tags", n, o) for n, o in repo.tags.items()],
                        "converts": [],
                        "pullRequests": [],
                    }
                )
            if method == "GET" and action == "commits":
                commit: Commit | None = repo.resolve(arg)
                history = []
                while commit is not None:
                    history.append(
                        {
                            "id": commit.oid,
                            "title": commit.title,
                            "message": commit.message,
                            "date": commit.date,
                            "authors": [{"user": state.user}],
                        }
                    )
                    commit = repo.commits[commit.parent] if commit.parent else None
                return self._json(history)
            if method == "POST" and action == "preupload":
                commit = repo.resolve(arg)
                files = json.loads(body).get("files", [])
                out = []
                for f in files:
                    mode = state.upload_mode(f["path"], int(f.get("size", 0)))
                    remote = commit.files.get(f["path"])
                    oid = (remote.sha256 if mode == "lfs" else remote.git_oid) if remote else None
                    out.append({"path": f["path"], "uploadMode": mode, "shouldIgnore": False, "oid": oid})
                return self._json({"files": out, "commitOid": commit.oid})
            if method == "POST" and action == "commit":
                if query.get("create_pr"):
                    raise HubError(501, "Pull requests are not served by the loopback hub")
                if self.headers.get("Content-Type", "").startswith("application/json"):
                    lines = self._json_commit_to_ndjson(json.loads(body))
                else:
                    lines = [json.loads(line) for line in body.splitlines() if line.strip()]
                new = state.commit(repo, arg, lines)
                return self._json(
                    {
                        "success": True,
                        "commitOid": new.oid,
                        "commitUrl": f"{self._repo_url(repo)}/commit/{new.oid}",
                        "pullRequestUrl": None,
                    }
                )
            if action == "branch" and method in ("POST", "DELETE"):
                if method == "DELETE":
                    if repo.branches.pop(arg, None) is None:
                        raise HubError(404, f"Invalid rev id: {arg}", "RevisionNotFound")
                    return self._json({})
                if arg in repo.branches:
                    raise HubError(409, f"Reference already exists: {arg}", "Conflict")
                start = json.loads(body or b"{}").get("startingPoint") or DEFAULT_BRANCH
                repo.branches[arg] = repo.resolve(start).oid
                return self._json({})
            if action == "tag" and method == "POST":
                tag = json.loads(body)["tag"]
                if tag in repo.tags:
                    raise HubError(409, f"Tag already exists: {tag}", "Conflict")
                repo.tags[tag] = repo.resolve(arg).oid
                return self._json({})
            if action in ("xet-write-token", "xet-read-token"):
                raise HubError(
                    501,
                    "The loopback hub does not serve Xet storage: upload LFS files with HF_HUB_DISABLE_XET=1 "
                    "(or use the default HubServer(lfs=False), which makes every file a regular upload).",
                )
        raise HubError(
            404, f"{method} {action!r} on {repo_type}s/{repo.repo_id} is not served by the loopback hub"
        )

    @staticmethod
    def _json_commit_to_ndjson(payload: dict[str, Any]) -> list[dict[str, Any]]:
        lines: list[dict[str, Any]] = [{"key": "header", "value": payload}]
        lines += [{"key": "file", "value": f} for f in payload.get("files", [])]
        lines += [{"key": "lfsFile", "value": f} for f in payload.get("lfsFiles", [])]
        lines += [{"key": "deletedFile", "value": f} for f in payload.get("deletedFiles", [])]
        return lines

    def _info(self, repo: Repo, commit: Commit) -> dict[str, Any]:
        card: dict[str, Any] = {}
        readme = commit.files.get("README.md")
        if readme is not None:
            text = self.state.blob_path(readme.sha256).read_text(encoding="utf-8", errors="replace")
            match = re.match(r"^---\s*\n(.*?)\n---\s*(\n|$)", text, re.DOTALL)
            loaded = yaml.safe_load(match.group(1)) if match else None
            card = loaded if isinstance(loaded, dict) else {}
        tags = list(card.get("tags") or [])
        if card.get("library_name") and card["library_name"] not in tags:
            tags.insert(0, card["library_name"])
        siblings = []
        for path, blob in sorted(commit.files.items()):
            sib: dict[str, Any] = {"rfilename": path, "size": blob.size, "blobId": blob.git_oid}
            if blob.lfs:
                sib["lfs"] = {"size": blob.size, "sha256": blob.sha256, "pointerSize": 134}
            siblings.append(sib)
        info = {
            "_id": repo.uid,
            "id": repo.repo_id,
            "author": repo.repo_id.split("/")[0],
            "sha": commit.oid,
            "lastModified": commit.date,
            "createdAt": repo.created_at,
            "private": bool(repo.private),
            "disabled": False,
            "gated": False,
            "downloads": 0,
            "likes": 0,
            "tags": tags,
            "siblings": siblings,
            "cardData": card or None,
            "usedStorage": sum(b.size for b in commit.files.values()),
        }
        if repo.repo_type == "model":
            info.update(
                modelId=repo.repo_id,
                library_name=card.get("library_name"),
                pipeline_tag=card.get("pipeline_tag"),
            )
        return info

    # -- /{repo}/resolve/..., /{repo}.git/info/lfs/objects/batch --------------------------------
    def _files(self, method: str, parts: list[str], body: bytes) -> None:
        repo_type = "model"
        if parts and parts[0] in ("datasets", "spaces"):
            repo_type, parts = TYPE_SEGMENTS[parts[0]], parts[1:]
        if len(parts) >= 4 and parts[2] == "resolve" and method in ("GET", "HEAD"):
            repo = self._repo(repo_type, parts[0], parts[1])
            with self.state.lock:
                commit = repo.resolve(parts[3])
            return self._resolve(commit, "/".join(parts[4:]))
        if len(parts) == 6 and parts[1].endswith(".git") and parts[2:] == ["info", "lfs", "objects", "batch"]:
            repo = self._repo(repo_type, parts[0], parts[1][: -len(".git")])
            return self._lfs_batch(json.loads(body))
        raise HubError(404, f"{method} /{'/'.join(parts)} is not served by the loopback hub")

    def _resolve(self, commit: Commit, path: str) -> None:
        blob = commit.files.get(path)
        if blob is None:
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound", commit.oid)
        headers = {
            "Content-Type": "application/octet-stream",
            "ETag": f'"{blob.etag}"',
            "X-Repo-Commit": commit.oid,
            "Accept-Ranges": "bytes",
        }
        if blob.lfs:
            headers.update({"X-Linked-Etag": f'"{blob.sha256}"', "X-Linked-Size": str(blob.size)})
        start, end = 0, blob.size - 1
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        status = 200
        if match and int(match.group(1)) < blob.size:
            start, end = int(match.group(1)), min(int(match.group(2) or blob.size - 1), blob.size - 1)
            headers["Content-Range"] = f"bytes {start}-{end}/{blob.size}"
            status = 206
        headers["Content-Length"] = str(max(end - start + 1, 0))
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command == "GET" and blob.size:
            with open(self.state.blob_path(blob.sha256), "rb") as fh:
                fh.seek(start)
                shutil.copyfileobj(_Limited(fh, end - start + 1), self.wfile)

    # -- LFS (basic transfer) ------------------------------------------------------------------
    def _lfs_batch(self, payload: dict[str, Any]) -> None:
        if payload.get("operation") != "upload":
            raise HubError(400, "Only LFS uploads are served", "BadRequest")
        objects = []
        for obj in payload.get("objects", []):
            oid, size = obj["oid"], int(obj["size"])
            entry: dict[str, Any] = {"oid": oid, "size": size, "authenticated": True}
            if self.state.lfs_blob(oid) is None:
                href = f"{self.server.url}/__lfs__/{oid}"
                entry["actions"] = {
                    "upload": {"href": href, "header": {}},
                    "verify": {"href": f"{href}/verify"},
                }
            objects.append(entry)
        body = json.dumps({"transfer": "basic", "objects": objects, "hash_algo": "sha256"}).encode()
        self._send(200, body, {"Content-Type": "application/vnd.git-lfs+json"})

    def _lfs_object(self, method: str, parts: list[str], body: bytes) -> None:
        oid = parts[0] if parts else ""
        if method == "PUT" and len(parts) == 1:
            if hashlib.sha256(body).hexdigest() != oid:
                raise HubError(400, f"Uploaded content does not match the LFS oid {oid}", "BadRequest")
            self.state.put_blob(body, lfs=True)
            return self._send(200)
        if method == "POST" and parts[1:] == ["verify"]:
            blob = self.state.lfs_blob(oid)
            if blob is None or blob.size != int(json.loads(body).get("size", -1)):
                raise HubError(404, f"LFS object {oid} missing or of the wrong size", "EntryNotFound")
            return self._json({})
        raise HubError(404, "Unknown LFS object route")


class _Limited:
    """A read-only view of the next ``n`` bytes of a file (for range responses)."""

    def __init__(self, fh: Any, n: int):
        self.fh, self.left = fh, n

    def read(self, size: int = -1) -> bytes:
        size = self.left if size < 0 else min(size, self.left)
        data = self.fh.read(size)
        self.left -= len(data)
        return data


class HubHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    state: HubState
    url: str
    requests: list[tuple[str, str, int]]

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.connections: set[socket.socket] = set()

    def process_request(self, request: Any, client_address: Any) -> None:
        self.connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        self.connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        """End idle keep-alive connections so that their handler threads exit now."""
        for conn in list(self.connections):
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


class HubServer:
    """A loopback Hub on ``127.0.0.1:<free port>``; use as a context manager or ``start()``/``stop()``.

    ``requests`` records ``(method, path, status)`` of every request served, for tests that assert
    what the client did (e.g. a cached download sends a HEAD but no GET).
    """

    def __init__(self, root: str | Path | None = None, *, user: str = "user", lfs: bool = False):
        self._tmp = tempfile.mkdtemp(prefix="loopback-hub-") if root is None else None
        self.state = HubState(Path(root or self._tmp), user=user, lfs=lfs)
        self._httpd: HubHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("HubServer is not started")
        return self._httpd.url

    @property
    def requests(self) -> list[tuple[str, str, int]]:
        return self._httpd.requests if self._httpd else []

    def start(self) -> HubServer:
        httpd = HubHTTPServer(("127.0.0.1", 0), HubRequestHandler)
        httpd.state, httpd.requests = self.state, []
        httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}"
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd.close_connections()
            self._httpd = None
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":  # manual use: python tests/helpers/hub_server.py  (Ctrl-C to stop)
    with HubServer() as hub:
        print(f"HF_ENDPOINT={hub.url}", flush=True)
        threading.Event().wait()
