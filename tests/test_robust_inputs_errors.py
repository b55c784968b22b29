"""The command line's one-line messages for the errors a user can meet but these tests cannot provoke on
this machine (the suite runs as root, which every permission lets through; a full disk): built from the real
exception types, and a bug's exception is left to show its traceback."""

from __future__ import annotations

import errno

import pytest

from peft_grounded.checks import describe


@pytest.mark.parametrize(
    "err, words",
    [
        (
            PermissionError(errno.EACCES, "Permission denied", "/data/items.csv"),
            ["/data/items.csv: permission denied"],
        ),
        (
            OSError(errno.ENOSPC, "No space left on device", "/runs/g/adapter"),
            ["no space left", "/runs/g/adapter", "previous versions are intact"],
        ),
        (
            IsADirectoryError(errno.EISDIR, "Is a directory", "/data"),
            ["/data is a directory, where a file was expected"],
        ),
        (
            NotADirectoryError(errno.ENOTDIR, "Not a directory", "/data/x/y"),
            ["a file stands where a directory is expected"],
        ),
        (
            FileNotFoundError(errno.ENOENT, "No such file or directory", "/nope"),
            ["/nope: no such file or directory"],
        ),
        (
            FileNotFoundError("no SID index at /x (missing sid_index.json)"),
            ["no SID index at /x"],
        ),  # ours, kept
        (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), ["not UTF-8 text"]),
    ],
    ids=["permission", "disk_full", "directory", "not_a_directory", "missing", "own_message", "utf8"],
)
def test_file_errors_become_one_line_naming_the_file(err, words):
    message = describe(err)
    for word in words:
        assert word in message, (word, message)


def test_hub_and_transport_errors_name_the_endpoint():
    from huggingface_hub.errors import OfflineModeIsEnabled

    assert "HF_HUB_OFFLINE=1 is set" in describe(OfflineModeIsEnabled("offline mode is enabled."))
    transport = pytest.importorskip("httpx2" if _has("httpx2") else "httpx")
    message = describe(transport.ConnectError("[Errno 111] Connection refused"))
    assert message.startswith("cannot reach the Hub at ") and "Connection refused" in message


def test_a_bug_keeps_its_traceback():
    assert describe(RuntimeError("an internal invariant broke")) is None
    assert describe(KeyError("row")) is None


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None
