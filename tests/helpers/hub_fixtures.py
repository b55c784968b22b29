"""Pytest fixtures that point the real ``huggingface_hub`` client at the loopback Hub (tests/helpers/hub_server.py).

- ``hub_server``: a started :class:`HubServer` (fresh, empty) for the test.
- ``hub_endpoint``: its URL, with THIS process's client pointed at it: env vars set (so that
  ``os.environ``-inheriting subprocesses follow) and the import-time copies in
  ``huggingface_hub.constants`` (``ENDPOINT``, ``HF_HUB_OFFLINE``, caches) and the module-level
  ``HfApi`` patched; HF_HOME is a temp dir and a dummy token is set (the server accepts any).
- ``hub_env``: an environment for a FRESH subprocess (``subprocess.run(..., env=hub_env)``) with
  its own empty HF_HOME, so what it reads really comes from the server.

The tests' conftest sets HF_HUB_OFFLINE=1 for the session; these fixtures undo it for one test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.hub_server import HubServer

HUB_TOKEN = "hf_loopback_dummy_token"


def hub_client_env(url: str, hf_home: str | Path) -> dict[str, str]:
    """Environment variables that send a process's huggingface_hub to ``url``, online, caching in ``hf_home``."""
    hf_home = Path(hf_home)
    return {
        "HF_ENDPOINT": url,
        "HF_HUB_OFFLINE": "0",
        "TRANSFORMERS_OFFLINE": "0",
        "HF_DATASETS_OFFLINE": "0",
        "HF_HOME": str(hf_home),
        "HF_HUB_CACHE": str(hf_home / "hub"),
        "HF_TOKEN": HUB_TOKEN,
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "HF_HUB_DISABLE_UPDATE_CHECK": "1",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }


def point_client_at(url: str, hf_home: str | Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point the already-imported huggingface_hub of this process at ``url`` (undone by ``monkeypatch``)."""
    from huggingface_hub import constants, hf_api

    env = hub_client_env(url, hf_home)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    hf_home = Path(hf_home)
    patches = {
        "ENDPOINT": url,
        "HUGGINGFACE_CO_URL_TEMPLATE": url + "/{repo_id}/resolve/{revision}/{filename}",
        "HF_URL_HOSTS": constants.HF_URL_HOSTS | {"127.0.0.1"},
        "HF_HUB_OFFLINE": False,
        "HF_HOME": str(hf_home),
        "HF_HUB_CACHE": env["HF_HUB_CACHE"],
        "HUGGINGFACE_HUB_CACHE": env["HF_HUB_CACHE"],
        "HF_ASSETS_CACHE": str(hf_home / "assets"),
        "HF_XET_CACHE": str(hf_home / "xet"),
        "HF_TOKEN_PATH": str(hf_home / "token"),
        "HF_STORED_TOKENS_PATH": str(hf_home / "stored_tokens"),
        "HF_HUB_DISABLE_TELEMETRY": True,
        "HF_HUB_DISABLE_UPDATE_CHECK": True,
    }
    for name, value in patches.items():
        monkeypatch.setattr(constants, name, value)
    monkeypatch.setattr(hf_api.api, "endpoint", url)  # the HfApi behind huggingface_hub.create_repo & co
    # transformers caches its own HfApi (and so its endpoint) on first use: make it build a new one.
    transformers_hub = sys.modules.get("transformers.utils.hub")
    if transformers_hub is not None and hasattr(transformers_hub, "_hf_api"):
        monkeypatch.setattr(transformers_hub, "_hf_api", None)


def run_python(code: str, env: dict[str, str], timeout: float = 120) -> str:
    """Run ``code`` in a fresh interpreter with ``env``; return its stdout, fail the test with its stderr."""
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        pytest.fail(f"subprocess failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc.stdout


@pytest.fixture
def hub_server(tmp_path: Path) -> Iterator[HubServer]:
    server = HubServer(tmp_path / "hub-storage").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def hub_endpoint(hub_server: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    point_client_at(hub_server.url, tmp_path / "hf-home", monkeypatch)
    yield hub_server.url


@pytest.fixture
def hub_env(hub_endpoint: str, tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "hf-home-subprocess"
    home.mkdir()
    return {**os.environ, **hub_client_env(hub_endpoint, home)}
