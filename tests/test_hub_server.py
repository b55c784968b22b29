"""The loopback Hub (tests/helpers/hub_server.py) driven by the real huggingface_hub client, in-process and in fresh processes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from helpers.hub_fixtures import run_python
from helpers.hub_server import HubServer, git_blob_oid
from huggingface_hub import (
    HfApi,
    constants,
    get_hf_file_metadata,
    hf_hub_download,
    hf_hub_url,
    snapshot_download,
)
from huggingface_hub.errors import (
    EntryNotFoundError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from safetensors.torch import save_file

REPO = "user/grounded-test"
README = "---\nlibrary_name: peft\nbase_model: some/base\ntags:\n- peft\n- peft_grounded\n---\n# Card\n"


def _make_folder(root: Path) -> dict[str, str]:
    """An adapter-like folder; returns {relative path: sha256}."""
    root.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    save_file({"new_rows": torch.randn(24, 16), "ids": torch.arange(24)}, root / "adapter_model.safetensors")
    (root / "adapter_config.json").write_text(json.dumps({"peft_type": "GROUNDED", "r": 0}))
    (root / "added_tokens.json").write_text(json.dumps({f"<a_{i}>": 49152 + i for i in range(24)}))
    (root / "README.md").write_text(README)
    (root / "sid").mkdir(exist_ok=True)
    (root / "sid" / "index.json").write_text(json.dumps({"levels": 3, "codes": 8}))
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _gets(hub_server: HubServer, filename: str) -> int:
    return sum(
        1 for m, path, s in hub_server.requests if m == "GET" and path.endswith(f"/resolve/main/{filename}")
    )


def test_push_then_pull_in_fresh_process_is_byte_identical(hub_endpoint, hub_env, hub_server, tmp_path):
    local = _make_folder(tmp_path / "adapter")
    api = HfApi()
    url = api.create_repo(REPO)
    assert url.repo_id == REPO and url.startswith(hub_endpoint)
    info = api.upload_folder(folder_path=tmp_path / "adapter", repo_id=REPO, commit_message="push adapter")
    assert sorted(api.list_repo_files(REPO)) == sorted([*local, ".gitattributes"])

    code = (
        "import hashlib, json, os, sys\n"
        "from pathlib import Path\n"
        "from huggingface_hub import hf_hub_download, snapshot_download\n"
        f"folder = Path(snapshot_download({REPO!r}))\n"
        "hashes = {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()\n"
        "          for p in folder.rglob('*') if p.is_file()}\n"
        f"one = hf_hub_download({REPO!r}, 'adapter_model.safetensors', revision={info.oid!r})\n"
        "print(json.dumps({'hashes': hashes, 'folder': str(folder), 'one': one}))\n"
    )
    out = json.loads(run_python(code, hub_env).strip().splitlines()[-1])
    pulled = {k: v for k, v in out["hashes"].items() if k != ".gitattributes"}
    assert pulled == local
    # The fresh process used its own, initially empty cache: the bytes came over HTTP.
    assert out["folder"].startswith(hub_env["HF_HUB_CACHE"]) and info.oid in out["folder"]
    assert _gets(hub_server, "adapter_model.safetensors") == 0  # snapshot went through the commit id
    assert any(m == "GET" and "adapter_model.safetensors" in p for m, p, _ in hub_server.requests)
    # The client never negotiated Xet storage, whether or not hf_xet is installed.
    assert not any("xet" in path for _, path, _ in hub_server.requests)
    assert all(status < 500 for _, _, status in hub_server.requests)


def test_file_metadata_and_repo_info(hub_endpoint):
    api = HfApi()
    api.create_repo(REPO)
    body = json.dumps({"peft_type": "GROUNDED"}).encode()
    commit = api.upload_file(path_or_fileobj=body, path_in_repo="adapter_config.json", repo_id=REPO)
    api.upload_file(path_or_fileobj=README.encode(), path_in_repo="README.md", repo_id=REPO)

    meta = get_hf_file_metadata(hf_hub_url(REPO, "adapter_config.json", revision=commit.oid))
    assert meta.etag == git_blob_oid(body)
    assert meta.size == len(body)
    assert meta.commit_hash == commit.oid
    assert meta.xet_file_data is None

    info = api.model_info(REPO, files_metadata=True)
    assert info.id == REPO and info.sha == api.list_repo_refs(REPO).branches[0].target_commit
    assert info.library_name == "peft" and "peft_grounded" in info.tags
    assert info.card_data is not None and info.card_data["base_model"] == "some/base"
    sizes = {s.rfilename: s.size for s in info.siblings}
    assert sizes["adapter_config.json"] == len(body) and "README.md" in sizes
    assert api.repo_exists(REPO) and api.file_exists(REPO, "README.md")
    assert not api.repo_exists("user/absent") and not api.file_exists(REPO, "absent.json")
    assert [c.title for c in api.list_repo_commits(REPO)] == [
        "Upload README.md with huggingface_hub",
        "Upload adapter_config.json with huggingface_hub",
        "initial commit",
    ]
    api.delete_repo(REPO)
    with pytest.raises(RepositoryNotFoundError):
        api.model_info(REPO)


def test_missing_repo_file_and_revision_raise_the_clients_errors(hub_endpoint):
    api = HfApi()
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("user/absent", "adapter_config.json")
    with pytest.raises(RepositoryNotFoundError):
        api.model_info("user/absent")
    with pytest.raises(RepositoryNotFoundError):
        api.upload_file(path_or_fileobj=b"{}", path_in_repo="a.json", repo_id="user/absent")

    api.create_repo(REPO)
    api.upload_file(path_or_fileobj=b"{}", path_in_repo="a.json", repo_id=REPO)
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(REPO, "absent.json")
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(REPO, "a.json", revision="no-such-branch")
    with pytest.raises(RevisionNotFoundError):
        api.model_info(REPO, revision="0" * 40)
    assert api.create_repo(REPO, exist_ok=True).repo_id == REPO
    with pytest.raises(HfHubHTTPError) as err:
        api.create_repo(REPO)
    assert err.value.response.status_code == 409


def test_revisions_branches_tags_and_parent_commit(hub_endpoint):
    api = HfApi()
    api.create_repo(REPO)
    v1 = api.upload_file(path_or_fileobj=b"v1", path_in_repo="w.txt", repo_id=REPO)
    api.create_branch(REPO, branch="release", revision=v1.oid)
    api.create_tag(REPO, tag="v1.0", revision=v1.oid)
    v2 = api.upload_file(path_or_fileobj=b"v2", path_in_repo="w.txt", repo_id=REPO)
    assert v2.oid != v1.oid

    def read(revision: str) -> bytes:
        return Path(hf_hub_download(REPO, "w.txt", revision=revision)).read_bytes()

    assert read("main") == b"v2" and read(v2.oid) == b"v2"
    assert read(v1.oid) == b"v1" and read("release") == b"v1" and read("v1.0") == b"v1"

    on_branch = api.upload_file(
        path_or_fileobj=b"v1.1", path_in_repo="w.txt", repo_id=REPO, revision="release"
    )
    assert read("release") == b"v1.1" and read("main") == b"v2"
    refs = api.list_repo_refs(REPO)
    assert {b.name: b.target_commit for b in refs.branches} == {"main": v2.oid, "release": on_branch.oid}
    assert {t.name: t.target_commit for t in refs.tags} == {"v1.0": v1.oid}
    with pytest.raises(HfHubHTTPError) as err:  # parent_commit guards against concurrent pushes
        api.upload_file(path_or_fileobj=b"x", path_in_repo="w.txt", repo_id=REPO, parent_commit=v1.oid)
    assert err.value.response.status_code == 412
    api.delete_file("w.txt", repo_id=REPO)
    assert "w.txt" not in api.list_repo_files(REPO)
    assert read(v2.oid) == b"v2"  # history is kept


def test_etag_cache_serves_second_download_without_get(hub_endpoint, hub_server):
    api = HfApi()
    api.create_repo(REPO)
    api.upload_file(path_or_fileobj=b"one", path_in_repo="c.json", repo_id=REPO)

    first = hf_hub_download(REPO, "c.json")
    assert _gets(hub_server, "c.json") == 1
    heads_before = sum(1 for m, p, _ in hub_server.requests if m == "HEAD" and p.endswith("/main/c.json"))
    second = hf_hub_download(REPO, "c.json")
    assert second == first and _gets(hub_server, "c.json") == 1  # ETag matched: served from the cache
    assert (
        sum(1 for m, p, _ in hub_server.requests if m == "HEAD" and p.endswith("/main/c.json")) > heads_before
    )

    api.upload_file(path_or_fileobj=b"two", path_in_repo="c.json", repo_id=REPO)
    third = hf_hub_download(REPO, "c.json")
    assert Path(third).read_bytes() == b"two" and _gets(hub_server, "c.json") == 2
    assert Path(first).read_bytes() == b"one"  # the old snapshot is untouched


def test_lfs_upload_path_when_xet_is_off(hub_endpoint, hub_server, tmp_path, monkeypatch):
    """With ``lfs=True`` weights go through the LFS batch API (what the client does without Xet)."""
    hub_server.state.lfs = True
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    local = _make_folder(tmp_path / "adapter")
    api = HfApi()
    api.create_repo(REPO)
    api.upload_folder(folder_path=tmp_path / "adapter", repo_id=REPO)

    paths = [(m, p) for m, p, _ in hub_server.requests]
    assert ("POST", f"/{REPO}.git/info/lfs/objects/batch") in paths
    assert any(m == "PUT" and p.endswith(local["adapter_model.safetensors"]) for m, p in paths)
    entries = {f.path: f for f in api.list_repo_tree(REPO)}
    assert entries["adapter_model.safetensors"].lfs.sha256 == local["adapter_model.safetensors"]
    assert entries["adapter_config.json"].lfs is None
    meta = get_hf_file_metadata(hf_hub_url(REPO, "adapter_model.safetensors"))
    assert meta.etag == local["adapter_model.safetensors"]  # LFS files are tagged by their sha256
    folder = Path(snapshot_download(REPO))
    assert hashlib.sha256((folder / "adapter_model.safetensors").read_bytes()).hexdigest() == meta.etag


@pytest.mark.slow  # a fresh interpreter importing peft takes several seconds
def test_transformers_and_peft_push_then_load_by_hub_id_in_fresh_process(
    hub_endpoint, hub_env, smollm2_dir, tmp_path
):
    """push_to_hub of a tokenizer, a base model and a LoRA adapter; then from_pretrained("user/...") elsewhere."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    tokenizer.add_tokens(["<a_0>", "<a_1>"])
    config = LlamaConfig(
        vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2
    )
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(config).eval()
    base.push_to_hub("user/tiny-base")
    model = get_peft_model(
        base, LoraConfig(r=2, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    model.push_to_hub("user/tiny-lora")
    tokenizer.push_to_hub("user/tiny-lora")
    ids = [[1, 5, 17, 255]]
    with torch.no_grad():
        expected = model(torch.tensor(ids)).logits
    torch.save(expected, tmp_path / "expected.pt")

    code = (
        "import torch\n"
        "from peft import PeftConfig, PeftModel\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "assert PeftConfig.from_pretrained('user/tiny-lora').peft_type == 'LORA'\n"
        f"assert len(AutoTokenizer.from_pretrained('user/tiny-lora')) == {len(tokenizer)}\n"
        "base = AutoModelForCausalLM.from_pretrained('user/tiny-base')\n"
        "model = PeftModel.from_pretrained(base, 'user/tiny-lora').eval()\n"
        "with torch.no_grad():\n"
        f"    logits = model(torch.tensor({ids})).logits\n"
        f"print(torch.equal(logits, torch.load({str(tmp_path / 'expected.pt')!r})))\n"
    )
    assert run_python(code, hub_env).strip().splitlines()[-1] == "True"
