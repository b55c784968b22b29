"""push and pull without a network: the Hub client's errors (a refused connection, offline mode) become one
``error: ...`` line naming the endpoint and the fix, never a traceback, and nothing local changes.

The connection is really refused: the client is pointed at a loopback port nothing listens on."""

# ruff: noqa: F811 (the world fixture is imported, then named by the tests)
from __future__ import annotations

import socket

import pytest
from helpers.hub_fixtures import point_client_at
from helpers.robust_world import refused, snapshot, world  # noqa: F401


@pytest.fixture
def dead_endpoint(tmp_path, monkeypatch) -> str:
    """The Hub client of this process sent to a loopback port that refuses connections."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    point_client_at(url, tmp_path / "hf-home", monkeypatch)
    return url


def test_push_without_a_network_names_the_endpoint(world, tmp_path, capsys, dead_endpoint):
    before = snapshot(world["root"])
    line = refused(capsys, "push", world["adapter"], "user/repo", "--model_name_or_path", "org/base")
    assert f"cannot reach the Hub at {dead_endpoint}" in line and "ConnectError" in line
    assert "check the network connection" in line
    assert snapshot(world["root"]) == before


def test_pull_without_a_network_creates_nothing(tmp_path, capsys, dead_endpoint):
    line = refused(capsys, "pull", "user/repo", tmp_path / "pulled")
    assert f"cannot reach the Hub at {dead_endpoint}" in line
    assert not (tmp_path / "pulled").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".pulled")]  # no temporary folder left


def test_push_in_offline_mode_says_how_to_go_online(world, tmp_path, capsys, dead_endpoint, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    line = refused(capsys, "push", world["adapter"], "user/repo", "--model_name_or_path", "org/base")
    assert "HF_HUB_OFFLINE=1 is set" in line and "unset it" in line


def test_pull_of_a_malformed_repo_id_is_refused_before_any_request(tmp_path, capsys, dead_endpoint):
    line = refused(capsys, "pull", "not a repo id!", tmp_path / "pulled")
    assert "repo id" in line.lower() and "cannot reach" not in line
    assert not (tmp_path / "pulled").exists()


def test_pull_into_a_non_empty_folder_is_refused_and_keeps_it(tmp_path, capsys, dead_endpoint):
    target = tmp_path / "mine"
    target.mkdir()
    (target / "notes.txt").write_text("keep me")
    line = refused(capsys, "pull", "user/repo", target)
    assert "exists and is not empty" in line and "overwrite" in line
    assert (target / "notes.txt").read_text() == "keep me"
