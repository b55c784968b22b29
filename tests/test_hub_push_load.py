"""Sharing grounded adapters on the (loopback) Hub: push, pull in a fresh process, files, card, index, errors."""

from __future__ import annotations

import json
import os
import textwrap

import numpy as np
import pytest
import torch
from helpers.hub_fixtures import run_python
from helpers.toy_catalogue import toy_catalogue, toy_index
from huggingface_hub import HfApi, ModelCard
from peft import LoraConfig, PeftConfig, get_peft_model
from safetensors import safe_open

import peft_grounded
from peft_grounded import GroundedTokenConfig
from peft_grounded.cli import main as cli_main
from peft_grounded.hub import GroundedHubError, load_grounded, load_sid_index, push_grounded
from peft_grounded.sids import SIDIndex

BASE = "org/tiny-base"
TESTS_DIR = os.path.dirname(__file__)
# (repo, arch, tied, extra embedding rows as in Qwen3 checkpoints, stacked LoRA)
VARIANTS = [
    ("user/llama-tied", "llama", True, 0, False),
    ("user/qwen3-untied", "qwen3", False, 64, False),
    ("user/llama-untied-lora", "llama", False, 0, True),
    ("user/qwen3-tied-lora", "qwen3", True, 64, True),
]


@pytest.fixture(scope="module")
def index() -> SIDIndex:
    return toy_index(toy_catalogue())  # 3 levels (4, 4, 2): 10 SID tokens


def grounded(tokenizer, factory, index, arch="llama", tied=True, extra=0, lora=False, **kw):
    """A grounded adapter (rows moved off their init), optionally with a non-zero stacked LoRA."""
    base = factory(arch, tied, extra_rows=extra)
    new = peft_grounded.add_tokens(tokenizer, base, index.token_strings)
    model = get_peft_model(
        base, GroundedTokenConfig(token_indices=new, init="random", task_type="CAUSAL_LM"), **kw
    )
    if lora:
        peft_grounded.add_lora(
            model, r=2, lora_alpha=4, lora_dropout=0.0, target_modules=["q_proj", "v_proj"]
        )
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.1 * torch.randn(p.shape, generator=generator))
    return model.eval(), new


def inputs(new) -> torch.Tensor:
    return torch.tensor([[1, 17, new[0], new[-1], 400, new[4]], [5, new[1], 300, new[8], new[9], 2]])


def push_variants(tokenizer, factory, index, variants) -> dict[str, dict[str, torch.Tensor]]:
    """Push each variant; return its inputs and logits before the push."""
    from transformers import AutoTokenizer

    expected = {}
    for repo, arch, tied, extra, lora in variants:
        fresh = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
        model, new = grounded(fresh, factory, index, arch, tied, extra, lora)
        push_grounded(model, repo, index=index if lora else None, card_facts={"base_model": BASE})
        with torch.no_grad():
            expected[repo] = {"inputs": inputs(new), "logits": model(input_ids=inputs(new)).logits}
    return expected


def test_push_then_load_by_hub_id_gives_identical_logits(tokenizer, tiny_model_factory, index, hub_endpoint):
    """In this process (quick); the fresh-process version below covers every variant."""
    from peft import PeftModel
    from transformers import AutoTokenizer

    variants = [VARIANTS[1], VARIANTS[2]]  # untied Qwen3 with padding rows; untied Llama with a LoRA
    expected = push_variants(tokenizer, tiny_model_factory, index, variants)
    for repo, arch, tied, extra, _ in variants:
        fresh = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
        model = load_grounded(tiny_model_factory(arch, tied, extra_rows=extra), fresh, repo)
        with torch.no_grad():
            assert torch.equal(model(input_ids=expected[repo]["inputs"]).logits, expected[repo]["logits"]), (
                repo
            )
    repo, arch, tied, extra, _ = variants[1]
    base = tiny_model_factory(arch, tied, extra_rows=extra)
    fresh = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    peft_grounded.add_tokens(fresh, base, PeftConfig.from_pretrained(repo).token_strings)
    model = PeftModel.from_pretrained(base, repo)  # PEFT alone, after `import peft_grounded`
    with torch.no_grad():
        assert torch.equal(model(input_ids=expected[repo]["inputs"]).logits, expected[repo]["logits"])


@pytest.mark.slow  # a fresh interpreter importing torch, transformers and peft takes 10-15 s on a busy machine
def test_push_then_load_in_a_fresh_process_gives_identical_logits(
    tokenizer, tiny_model_factory, index, hub_endpoint, hub_env, tmp_path
):
    torch.save(push_variants(tokenizer, tiny_model_factory, index, VARIANTS), tmp_path / "expected.pt")
    for _, arch, tied, extra in [v[:4] for v in VARIANTS]:  # the fresh process loads the same bases from disk
        tiny_model_factory(arch, tied, extra_rows=extra).save_pretrained(
            tmp_path / f"base-{arch}-{tied}-{extra}"
        )
    script = textwrap.dedent(
        f"""
        import json, torch
        from peft import PeftConfig, PeftModel
        from transformers import AutoModelForCausalLM, AutoTokenizer
        import peft_grounded
        from peft_grounded import assets
        from peft_grounded.hub import load_grounded, load_sid_index

        expected = torch.load({str(tmp_path / "expected.pt")!r})
        variants = {[v[:4] for v in VARIANTS]!r}
        out = {{}}

        def build_tiny_model(arch, tied, extra_rows):
            path = {str(tmp_path)!r} + f"/base-{{arch}}-{{tied}}-{{extra_rows}}"
            return AutoModelForCausalLM.from_pretrained(path).eval()

        def same(model, repo):
            with torch.no_grad():
                return torch.equal(model(input_ids=expected[repo]["inputs"]).logits, expected[repo]["logits"])

        for repo, arch, tied, extra in variants:
            tokenizer = AutoTokenizer.from_pretrained(assets.smollm2())
            model = load_grounded(build_tiny_model(arch, tied, extra_rows=extra), tokenizer, repo)
            out[repo] = same(model, repo)
        # PEFT alone, after `import peft_grounded`, with the tokens added by the user (the card's recipe).
        repo, arch, tied, extra = variants[2]
        config = PeftConfig.from_pretrained(repo)
        base, tokenizer = build_tiny_model(arch, tied, extra_rows=extra), AutoTokenizer.from_pretrained(assets.smollm2())
        peft_grounded.add_tokens(tokenizer, base, config.token_strings)
        out["PeftModel.from_pretrained"] = same(PeftModel.from_pretrained(base, repo), repo)
        index = load_sid_index(repo)
        out["index"] = [index.item_ids, index.codes.tolist(), index.sid_text(index.item_ids[3])]
        print(json.dumps(out))
        """
    )
    result = json.loads(run_python(script, hub_env).strip().splitlines()[-1])
    assert result.pop("index") == [index.item_ids, index.codes.tolist(), index.sid_text(index.item_ids[3])]
    assert result == {**{v[0]: True for v in VARIANTS}, "PeftModel.from_pretrained": True}


def test_pushed_repo_holds_rows_card_tokenizer_and_index_in_one_commit(
    tokenizer, tiny_model_factory, index, hub_endpoint
):
    model, new = grounded(tokenizer, tiny_model_factory, index, "llama", tied=False, adapter_name="sid")
    facts = {"base_model": BASE, "metrics": {"test recall@10": 0.25}, "diagnostics": {"effective rank": 7.5}}
    info = push_grounded(model, "user/full", tokenizer=tokenizer, index=index, card_facts=facts)
    api = HfApi()
    assert (
        info.commit_url.endswith(info.oid) and len(api.list_repo_commits("user/full")) == 2
    )  # create + push
    files = set(api.list_repo_files("user/full"))
    assert {"adapter_config.json", "adapter_model.safetensors", "README.md", "tokenizer.json"} <= files
    assert "sid_index/sid_index.json" in files
    assert any(f.startswith("sid_index/sid_index.") and f.endswith(".safetensors") for f in files)
    assert not any(f.endswith((".bin", ".pt", ".pth")) for f in files)

    # Only the new rows (input and untied head): n_new x d x 4 bytes each, no full embedding.
    weights = api.hf_hub_download("user/full", "adapter_model.safetensors")
    with safe_open(weights, "pt") as handle:
        shapes = sorted(handle.get_slice(k).get_shape() for k in handle.keys())  # noqa: SIM118
    d = model.get_base_model().config.hidden_size
    assert shapes == [[len(new), d], [len(new), d]]
    assert os.path.getsize(weights) <= 2 * len(new) * d * 4 + 1024

    config = PeftConfig.from_pretrained("user/full")
    assert config.token_strings == index.token_strings and config.base_model_name_or_path == BASE
    card = ModelCard.load("user/full")
    assert card.data.base_model == BASE and card.data.library_name == "peft"
    assert {"peft", "peft_grounded", f"base_model:adapter:{BASE}"} <= set(card.data.tags)
    assert "lora" not in card.data.tags
    shown = (
        "| Levels x codes | 4 / 4 / 2 |",
        "| New tokens | 10 |",
        "**random**",
        "| test recall@10 | 0.25 |",
        "| effective rank | 7.5 |",
        'load_sid_index("user/full")',
        'load_grounded(base, tokenizer, "user/full")',
    )
    for text in shown:
        assert text in card.text, text
    assert "peft_grounded" in api.model_info("user/full").tags

    pulled = load_sid_index("user/full")
    assert pulled.item_ids == index.item_ids and (pulled.codes == index.codes).all()
    assert all((pulled.centroids[v] == index.centroids[v]).all() for v in index.centroids)
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained("user/full").convert_tokens_to_ids(index.token_strings) == list(new)

    # A push to a new branch without an index keeps the index the branch started with, and leaves main alone.
    push_grounded(model, "user/full", card_facts={"base_model": BASE}, revision="v2")
    assert "v2" in {b.name for b in api.list_repo_refs("user/full").branches}
    on_main = {f for f in files if f.startswith("sid_index/")}
    assert on_main <= set(api.list_repo_files("user/full", revision="v2"))
    assert set(api.list_repo_files("user/full")) == files


def test_a_push_deletes_only_what_it_replaces(tokenizer, tiny_model_factory, index, hub_endpoint):
    """Without index= the repo's SID index stays; with one, the old index's files go (no stale tensor file)."""
    import copy

    model, _ = grounded(tokenizer, tiny_model_factory, index)
    facts = {"base_model": BASE}
    push_grounded(model, "user/keep", index=index, card_facts=facts)
    api = HfApi()

    def index_files() -> set[str]:
        return {f for f in api.list_repo_files("user/keep") if f.startswith("sid_index/")}

    first = index_files()
    assert "sid_index/sid_index.json" in first
    push_grounded(model, "user/keep", card_facts=facts)  # e.g. a retrained adapter, same SIDs
    assert index_files() == first
    assert load_sid_index("user/keep").item_ids == index.item_ids

    other = copy.deepcopy(index)  # same SID tokens, other tensors: a new content-named tensor file
    other.item_interactions = np.asarray(index.item_interactions) + 1
    push_grounded(model, "user/keep", index=other, card_facts=facts)
    second = index_files()
    assert len(second) == 2 and second != first  # the JSON and the new tensor file only
    assert (load_sid_index("user/keep").item_interactions == other.item_interactions).all()


def test_missing_template_is_a_clear_error(monkeypatch, tmp_path):
    from peft_grounded.hub import card

    monkeypatch.setattr(card, "template_candidates", lambda: [tmp_path / "a.md", tmp_path / "b.md"])
    with pytest.raises(
        FileNotFoundError, match=r"grounded_adapter.md not found \(looked in: .*a.md, .*b.md\)"
    ):
        card.render_model_card({"base_model": BASE})


def test_load_from_a_folder_and_with_a_tokenizer_that_has_the_tokens(
    tokenizer, tiny_model_factory, index, tmp_path
):
    model, new = grounded(tokenizer, tiny_model_factory, index, "qwen3", tied=False, extra=64)
    model.save_pretrained(tmp_path / "adapter")
    with torch.no_grad():
        expected = model(input_ids=inputs(new)).logits
    # `tokenizer` already carries the tokens (e.g. the one pushed with the adapter): only the base is extended.
    loaded = load_grounded(tiny_model_factory("qwen3", False, extra_rows=64), tokenizer, tmp_path / "adapter")
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=inputs(new)).logits, expected)


def _upload(api: HfApi, repo: str, folder) -> None:
    api.create_repo(repo)
    api.upload_folder(repo_id=repo, folder_path=folder)


def test_load_errors_name_the_problem_and_leave_base_and_tokenizer_untouched(
    tokenizer, tiny_model_factory, index, hub_endpoint, hub_server, tmp_path
):
    from transformers import AutoTokenizer

    model, _ = grounded(tokenizer, tiny_model_factory, index)
    push_grounded(model, "user/ok", card_facts={"base_model": BASE})
    fresh = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    base = tiny_model_factory("llama", True)
    rows, size = base.get_input_embeddings().weight.shape[0], len(fresh)

    def fails(match: str, repo, model=base, tok=fresh, **kw):
        with pytest.raises(GroundedHubError, match=match):
            load_grounded(model, tok, repo, **kw)
        assert base.get_input_embeddings().weight.shape[0] == rows and len(fresh) == size

    fails("not a valid Hub repo id", "user/a/b")
    fails("not a valid Hub repo id", "user/bad--name")
    fails("No model repo 'user/absent'", "user/absent")
    fails("has no revision 'v9'", "user/ok", revision="v9")
    fails(f"made for base model '{BASE}'.*other vocabulary rows", "user/ok", model=tiny_model_factory(seed=1))
    extra = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    extra.add_tokens(["<other>"])
    fails("the tokenizer has other added tokens", "user/ok", tok=extra)

    api = HfApi()
    (tmp_path / "card").mkdir()
    (tmp_path / "card" / "README.md").write_text("# nothing here\n")
    _upload(api, "user/no-adapter", tmp_path / "card")
    fails("holds no adapter: there is no adapter_config.json", "user/no-adapter")

    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "adapter_config.json").write_text(json.dumps({"peft_type": "GROUNDED_TOKENS"}))
    (pickled / "adapter_model.bin").write_bytes(b"\x80\x04not really a pickle")
    _upload(api, "user/pickled", pickled)
    fails(r"only pickled adapter weights \(adapter_model.bin\).*safetensors only", "user/pickled")
    assert not any(m == "GET" and p.endswith(".bin") for m, p, _ in hub_server.requests)  # never downloaded

    lora = get_peft_model(tiny_model_factory(), LoraConfig(r=2, target_modules=["q_proj"]))
    lora.save_pretrained(tmp_path / "lora")
    _upload(api, "user/lora", tmp_path / "lora")
    fails("holds a LORA adapter, not a grounded-token adapter", "user/lora")
    fetched = [p for m, p, _ in hub_server.requests if m == "GET" and p.startswith("/user/lora/resolve/")]
    assert fetched and all(p.endswith("/adapter_config.json") for p in fetched)  # refused before the weights

    # Another base vocabulary (fingerprint), from a local folder.
    model.save_pretrained(tmp_path / "other-vocab")
    path = tmp_path / "other-vocab" / "adapter_config.json"
    path.write_text(path.read_text().replace("sha256:", "sha256:0"))
    fails("tokenizer's base vocabulary differs", tmp_path / "other-vocab")
    fails("No folder", "./no/such/folder")


def test_push_refuses_what_is_not_a_clean_grounded_adapter(
    tokenizer, tiny_model_factory, index, hub_endpoint, tmp_path
):
    from transformers import AutoTokenizer

    model, _ = grounded(tokenizer, tiny_model_factory, index)
    with pytest.raises(GroundedHubError, match="not a valid Hub repo id"):
        push_grounded(model, "user/a/b", card_facts={"base_model": BASE})
    with pytest.raises(GroundedHubError, match="not a Hub model id"):
        push_grounded(model, "user/x", card_facts={"base_model": str(tmp_path / "local-base")})
    with pytest.raises(GroundedHubError, match="does not record its base model"):
        push_grounded(model, "user/x")
    with pytest.raises(GroundedHubError, match="tokenizer does not match"):
        fresh = AutoTokenizer.from_pretrained(tokenizer.name_or_path)  # without the SID tokens
        push_grounded(model, "user/x", tokenizer=fresh, card_facts={"base_model": BASE})
    other = toy_index(toy_catalogue(n_items=40), codes=8)
    with pytest.raises(GroundedHubError, match="tokens the adapter does not have"):
        push_grounded(model, "user/x", index=other, card_facts={"base_model": BASE})
    model.save_pretrained(tmp_path / "full", save_embedding_layers=True)
    with pytest.raises(GroundedHubError, match="base-model tensor"):
        push_grounded(tmp_path / "full", "user/x", card_facts={"base_model": BASE})
    lora = get_peft_model(tiny_model_factory(), LoraConfig(r=2, target_modules=["q_proj"]))
    with pytest.raises(GroundedHubError, match="not a grounded-token adapter"):
        push_grounded(lora, "user/x", card_facts={"base_model": BASE})
    assert not HfApi().repo_exists("user/x")  # nothing was created by a refused push


def test_cli_push_and_pull(tokenizer, tiny_model_factory, index, hub_endpoint, tmp_path, capsys):
    model, _ = grounded(tokenizer, tiny_model_factory, index, lora=True)
    model.save_pretrained(tmp_path / "adapter")
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    index.save(tmp_path / "index")
    metrics = {"test": {"all": {"recall@10": 0.5, "ndcg@10": 0.25}}}
    (tmp_path / "metrics.json").write_text(json.dumps(metrics))
    args = ["push", str(tmp_path / "adapter"), "user/cli", "--model_name_or_path", BASE]
    args += ["--sid-index", str(tmp_path / "index"), "--metrics", str(tmp_path / "metrics.json")]
    args += ["--tokenizer", str(tmp_path / "tokenizer")]
    assert cli_main(args) == 0
    assert "/user/cli/commit/" in capsys.readouterr().out
    card = ModelCard.load("user/cli")
    assert "| test / all / recall@10 | 0.5 |" in card.text and "lora" in card.data.tags

    assert cli_main(["pull", "user/cli", str(tmp_path / "pulled")]) == 0
    pulled = {
        p.relative_to(tmp_path / "pulled").as_posix() for p in (tmp_path / "pulled").rglob("*") if p.is_file()
    }
    assert {
        "adapter_config.json",
        "adapter_model.safetensors",
        "README.md",
        "sid_index/sid_index.json",
    } <= pulled
    assert not any(p.startswith(".cache") for p in pulled)
    assert SIDIndex.load(tmp_path / "pulled" / "sid_index").item_ids == index.item_ids

    assert cli_main(["pull", "user/cli", str(tmp_path / "pulled")]) == 2
    assert "not empty; pass overwrite" in capsys.readouterr().err
    assert cli_main(["push", str(tmp_path / "adapter"), "user/a/b"]) == 2
    assert "not a valid Hub repo id" in capsys.readouterr().err


@pytest.mark.slow  # builds a wheel and installs it into a new virtual environment (~20 s)
def test_installed_wheel_renders_the_card_from_its_package_data(tmp_path):
    """The template is package data (peft_grounded/hub/templates/); a (non-editable) wheel ships it there and
    importlib.resources finds it in site-packages."""
    import shutil
    import site
    import subprocess
    import sys
    import zipfile
    from pathlib import Path

    root = Path(TESTS_DIR).parent
    src = tmp_path / "src"  # build from a copy: no build/ or egg-info churn in the checkout
    shutil.copytree(
        root / "peft_grounded", src / "peft_grounded", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in ("pyproject.toml", "README.md"):
        if (root / name).exists():
            shutil.copy(root / name, src / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    build = [*pip, "wheel", str(src), "--no-deps", "--no-build-isolation", "--no-index", "-w", str(tmp_path)]
    subprocess.run(build, check=True, capture_output=True, timeout=300)
    wheel = next(tmp_path.glob("peft_grounded-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "peft_grounded/hub/templates/grounded_adapter.md" in names
    assert not any(n.startswith("model_cards/") or ".data/" in n for n in names)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    install = [*pip, "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # without PYTHONPATH: a checkout on it (with its egg-info) reads as installed, and pip would install nothing
    subprocess.run(install, check=True, capture_output=True, timeout=300, env=env)
    # Dependencies come from this environment, appended after the new venv's own site-packages (a plain
    # path: its .pth files, among them the editable install's finder, are not processed).
    where = [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]
    purelib = subprocess.run(where, check=True, capture_output=True, text=True).stdout.strip()
    Path(purelib, "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    code = (
        "import peft_grounded.hub.card as c\n"
        "assert 'site-packages' in c.__file__, c.__file__\n"
        "card = c.render_model_card({'base_model': 'org/base'})\n"
        "print(c.find_template()); print('base_model:adapter:org/base' in card.data.tags)\n"
    )
    out = subprocess.run(  # cwd: not the checkout, which `python -c` would put first on sys.path
        [str(python), "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    template, tagged = out.stdout.split()[-2:]
    assert template.endswith("site-packages/peft_grounded/hub/templates/grounded_adapter.md"), template
    assert tagged == "True"
