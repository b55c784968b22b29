"""Adversarial inputs to serving (``GroundedRecommender``, ``read_histories``, ``NewItemRule.load``, ``peft-grounded
recommend`` and ``pull``), each refused with one ``error: ...`` line (exit 2) that names the user, line, field or
file and the fix, with nothing written and the user's files untouched, or served with the exact lists:

- histories files: bad JSON, a non-object line, a missing or mistyped ``user``/``history`` (null, a list, an
  object, a boolean, blank), mistyped history entries, duplicate users, non-UTF-8 bytes, an empty file, a folder
  or a missing path for the file; a byte-order mark, CRLF endings and U+2028 inside a string are read; a
  5,000-item history is served from its tail;
- histories in the request: ``--history ""`` / ``"1,,2"``, an empty history, unknown items with and without
  ``--skip_unknown``, a history of unknown items only;
- numbers: ``k`` 0, negative, above the catalogue (refused before ``--output_dir`` is touched, so the corrected
  rerun succeeds), equal to the catalogue with the history left out; ``--num_beams``/``--decode_batch_size`` 0;
  ``candidates`` given as a string, empty, unknown, per user of the wrong count, holding None;
- damaged or foreign files: ``adapter_config.json`` truncated, of another PEFT type or not an object, truncated
  weights, ``sid_index/`` a link (loaded) or a link to a folder without an index, a truncated or mistyped index
  JSON; ``new_item_rule.json`` missing, adding or mistyping a field, a model weight out of range, weights of the
  wrong length, items edited, its vectors truncated, swapped or missing; a merged folder's
  ``grounded_serving.json`` missing a field or mistyped, and a merged folder without it (refused unless
  ``--sid_softmax`` says how it decodes);
- output folders: someone else's results without their settings, a file, a link or a path under a file, a
  folder the user cannot write (run as another user), a finished folder rerun (same histories: nothing decoded;
  changed: only those users), other settings, damaged settings, a torn or garbled partial line, Ctrl-C and
  SIGKILL while decoding or loading, two writers at once;
- the Hub: ``pull`` into a folder another process holds, into a file, a foreign repo from the loopback Hub (and
  a good one served), and a repo id with ``HF_HUB_OFFLINE=1``.

The served world (tiny base, toy SID index, "trained" adapter, grown adapter) is built once for the module;
commands run in-process except where a signal, another user or a second writer needs its own process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import build_tiny_model
from helpers.forked import run as run_forked
from helpers.forked import start, wait_for
from helpers.robust_faults import NOBODY, as_another_user
from helpers.robust_world import refused, run_cli, snapshot
from helpers.serving_fixtures import serving_world, write_histories

from peft_grounded._io import lock_path, output_lock
from peft_grounded.cli import main
from peft_grounded.serving import GroundedRecommender, NewItemRule, read_histories

K = 3
BEAMS = 8
HISTORIES = {"u1": ["0", "1", "2"], "u2": ["3", "7"], "u3": ["5"]}
MANY = {f"m{i}": [str(i), str((i + 5) % 16)] for i in range(8)}  # the users of the signal tests
LOGGED = {"a": ["0", "4", "new0"], "b": ["1", "new0", "new1"], "c": ["2", "6"], "d": ["3", "new2"]}
OUTPUT, PARTIAL, SETTINGS = (
    "recommendations.jsonl",
    "recommendations.jsonl.partial",
    "recommendations.settings.json",
)
RULE_FIX = "fit it again (grow-adapter --interactions FILE) or delete new_item_rule.json and new_item_rule.safetensors"
MERGED_FIX = "write the folder again with GroundedRecommender.save_merged, or delete grounded_serving.json"


# ----------------------------------------------------------------------------------------- the served world


@pytest.fixture(scope="module")
def world(tmp_path_factory, smollm2_dir) -> dict:
    """``root/adapter`` (with ``sid_index/``), ``root/grown`` (3 new items), ``root/sids``, the base."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("served")
    return serving_world(root, AutoTokenizer.from_pretrained(smollm2_dir), build_tiny_model)


@pytest.fixture(scope="module")
def recommender(world) -> GroundedRecommender:
    """The adapter as the command loads it (merged, float32 on the CPU, 8 beams)."""
    return GroundedRecommender.from_pretrained(world["root"] / "adapter", num_beams=BEAMS)


@pytest.fixture(scope="module")
def finished(world, tmp_path_factory) -> Path:
    """An output folder of a finished ``recommend --histories`` run over HISTORIES (tests copy it)."""
    root = tmp_path_factory.mktemp("finished")
    users = write_histories(root / "users.jsonl", HISTORIES)
    assert main(command(world, "--histories", users, "--output_dir", root / "out")) == 0
    return root / "out"


@pytest.fixture(scope="module")
def ruled(world, tmp_path_factory) -> Path:
    """The grown adapter with a new-item rule fitted on LOGGED and stored beside it."""
    folder = tmp_path_factory.mktemp("ruled") / "grown"
    shutil.copytree(world["root"] / "grown", folder)
    NewItemRule.fit(world["child"], LOGGED.values()).save(folder)
    return folder


@pytest.fixture(scope="module")
def merged(recommender, tmp_path_factory) -> Path:
    """A merged model folder written by ``save_merged``."""
    return recommender.save_merged(tmp_path_factory.mktemp("merged") / "model")


@pytest.fixture(scope="module")
def many_served(recommender) -> dict[str, list[str]]:
    """MANY's lists decoded one user at a time, as ``--decode_batch_size 1`` decodes them."""
    return served(recommender, MANY, chunk=1)


def command(world, *argv, adapter=None) -> list[str]:
    """``recommend`` of the world's adapter (or ``adapter``) with K items and BEAMS beams."""
    adapter = adapter or world["root"] / "adapter"
    return [str(a) for a in ("recommend", "--adapter", adapter, "--k", K, "--num_beams", BEAMS, *argv)]


def served(recommender, histories: dict[str, list[str]], chunk: int = 32, **options) -> dict[str, list[str]]:
    """Each user's items, decoded in chunks of ``chunk`` users as the command decodes them."""
    users, out = list(histories), {}
    for start_at in range(0, len(users), chunk):
        part = users[start_at : start_at + chunk]
        for result in recommender.recommend([histories[u] for u in part], k=K, users=part, **options):
            out[result.user] = result.items
    return out


def records(folder: Path, name: str = OUTPUT) -> list[dict]:
    return [json.loads(line) for line in (folder / name).read_text().splitlines()]


def assert_same_lists(got: list[dict], expected: list[dict]) -> None:
    """The same users, items and keys, in order; scores up to float rounding (another batch pads otherwise)."""
    strip = [{k: v for k, v in r.items() if k != "scores"} for r in got]
    assert strip == [{k: v for k, v in r.items() if k != "scores"} for r in expected]
    for a, b in zip(got, expected, strict=True):
        assert a["scores"] == pytest.approx(b["scores"], abs=1e-4)


def printed_items(out: str) -> list[str]:
    """The item column of the table ``recommend --history`` prints."""
    lines = out.strip().splitlines()
    assert lines[0].split()[:3] == ["rank", "item", "score"], out
    return [line.split()[1] for line in lines[1:]]


def copy(source: Path, tmp_path: Path, name: str | None = None) -> Path:
    target = tmp_path / (name or source.name)
    shutil.copytree(source, target)
    return target


# ----------------------------------------------------------------------------------------- histories files

LINE = '{"user": "a", "history": ["0"]}\n'
SHAPE = '{"user": ID, "history": [ITEM, ...]}'
MALFORMED = {  # file text -> what the error line says after the file's path
    "bad_json": (
        LINE + '{"user": "b", "history": [\n',
        ", line 2 is not JSON (Expecting value); write one JSON object per line",
    ),
    "a_list_line": ('["a", ["0"]]\n', f", line 1: expected {SHAPE}, got a JSON list"),
    "a_number_line": (LINE + "7\n", f", line 2: expected {SHAPE}, got a JSON int"),
    "no_user": ('{"history": ["0"]}\n', f", line 1: expected {SHAPE}, got fields ['history']"),
    "no_history": (
        '{"user": "a", "items": ["0"]}\n',
        f", line 1: expected {SHAPE}, got fields ['items', 'user']",
    ),
    "user_null": (
        '{"user": null, "history": ["0"]}\n',
        ', line 1: "user" is null; a user id is a string or an integer',
    ),
    "user_list": (
        '{"user": ["a"], "history": ["0"]}\n',
        ', line 1: "user" is ["a"]; a user id is a string or an integer',
    ),
    "user_object": (
        '{"user": {"id": 1}, "history": ["0"]}\n',
        ', line 1: "user" is {"id": 1}; a user id is a string or an integer',
    ),
    "user_true": (
        '{"user": true, "history": ["0"]}\n',
        ', line 1: "user" is true; a user id is a string or an integer',
    ),
    "user_blank": (
        '{"user": " ", "history": ["0"]}\n',
        ", line 1: \"user\" is ' '; a user id is a string or an integer",
    ),
    "history_text": (
        '{"user": "a", "history": "0,1"}\n',
        ", line 1: \"history\" is '0,1', not a list of item ids",
    ),
    "history_null": (
        '{"user": "a", "history": null}\n',
        ', line 1: "history" is null, not a list of item ids',
    ),
    "history_object": (
        '{"user": "a", "history": {"0": 1}}\n',
        ', line 1: "history" is {"0": 1}, not a list of item ids',
    ),
    "entry_null": (
        '{"user": "a", "history": ["0", null]}\n',
        ", line 1: \"history\" holds ['null']; item ids are strings or integers",
    ),
    "entry_list": (
        '{"user": "a", "history": ["0", ["1"]]}\n',
        ', line 1: "history" holds [\'["1"]\']; item ids are strings or integers',
    ),
    "entry_object": (
        '{"user": "a", "history": [{"id": "1"}]}\n',
        ', line 1: "history" holds [\'{"id": "1"}\']; item ids are strings or integers',
    ),
    "entry_bool": (
        '{"user": "a", "history": [false]}\n',
        ", line 1: \"history\" holds ['false']; item ids are strings or integers",
    ),
    "entry_float": (
        '{"user": "a", "history": [1.5]}\n',
        ", line 1: \"history\" holds ['1.5']; item ids are strings or integers",
    ),
    "duplicate_user": (
        LINE + '{"user": "a", "history": ["1"]}\n',
        ", line 2: user 'a' appears twice; give one line per user",
    ),
    "same_id_as_number": (
        '{"user": 1, "history": ["0"]}\n{"user": "1", "history": ["1"]}\n',
        ", line 2: user '1' appears twice; give one line per user",
    ),
    "empty_file": ("", " holds no users; write one JSON line per user"),
    "blank_lines_only": ("\n  \n\n", " holds no users; write one JSON line per user"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_histories_file_names_the_line_and_writes_nothing(world, tmp_path, capsys, case):
    text, said = MALFORMED[case]
    users = tmp_path / "users.jsonl"
    users.write_text(text, encoding="utf-8")
    before = snapshot(tmp_path)
    line = refused(capsys, *command(world, "--histories", users, "--output_dir", tmp_path / "out"))
    assert line == f"error: {users}{said}"
    assert snapshot(tmp_path) == before  # no output folder, no lock file, the file as it was


def test_a_histories_file_that_is_not_utf8_names_the_byte(world, tmp_path, capsys):
    users = tmp_path / "users.jsonl"
    users.write_bytes(b'{"user": "caf\xe9", "history": ["0"]}\n')  # Latin-1
    before = snapshot(tmp_path)
    line = refused(capsys, *command(world, "--histories", users, "--output_dir", tmp_path / "out"))
    assert line == f"error: {users} is not UTF-8 text (invalid continuation byte at byte 13); write JSONL"
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("kind", ["folder", "missing"])
def test_a_folder_or_a_missing_path_for_the_histories_file(world, tmp_path, capsys, kind):
    users = tmp_path / "users.jsonl"
    if kind == "folder":
        users.mkdir()
    line = refused(capsys, *command(world, "--histories", users, "--output_dir", tmp_path / "out"))
    what = "a folder" if kind == "folder" else "not there"
    assert line == f"error: {users} is {what}: give a JSONL file of users"
    assert sorted(p.name for p in tmp_path.iterdir()) == (["users.jsonl"] if kind == "folder" else [])


def test_a_byte_order_mark_crlf_and_a_line_separator_inside_a_string_are_read(tmp_path):
    users = tmp_path / "users.jsonl"
    lines = [
        json.dumps({"user": "a", "history": ["0"]}),
        json.dumps({"user": "b\u2028c", "history": [1, "2"]}, ensure_ascii=False),
    ]
    users.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(lines).encode("utf-8") + b"\r\n")
    assert read_histories(users) == (["a", "b\u2028c"], [["0"], ["1", "2"]])


def test_a_five_thousand_item_history_is_served_from_its_tail(world, recommender, tmp_path, capsys):
    tail = [str(i % 6) for i in range(10)]  # the prompt shows the last 10 items (PromptFormat.max_history)
    huge = [str(6 + i % 10) for i in range(4990)] + tail  # 5,000 items: far beyond the model's 256 positions
    users = write_histories(tmp_path / "users.jsonl", {"huge": huge, "tail": tail})
    out = tmp_path / "out"
    code, _, err = run_cli(
        capsys, *command(world, "--histories", users, "--output_dir", out, "--include_history")
    )
    assert code == 0 and f"2 users (2 decoded now) -> {out / OUTPUT}" in err
    lines = records(out)
    expected = served(recommender, {"huge": tail, "tail": tail}, exclude_history=False)
    assert [r["user"] for r in lines] == ["huge", "tail"]
    assert lines[0]["items"] == lines[1]["items"] == expected["huge"] and len(expected["huge"]) == K


# ----------------------------------------------------------------------------------------- histories in a request


@pytest.mark.parametrize(
    "history, said",
    [
        (
            "",
            "--history is empty: give the user's item ids, oldest first, comma-separated (e.g. --history 1,50,181)",
        ),
        (
            " , ",
            "--history is empty: give the user's item ids, oldest first, comma-separated (e.g. --history 1,50,181)",
        ),
        ("1,,2", "--history '1,,2' has an empty item at place 2: give item ids separated by single commas"),
        ("0,", "--history '0,' has an empty item at place 2: give item ids separated by single commas"),
    ],
    ids=["empty", "blank", "double_comma", "trailing_comma"],
)
def test_a_bad_history_flag_is_refused_before_loading(world, tmp_path, capsys, history, said):
    line = refused(capsys, *command(world, "--history", history, "--output_dir", tmp_path / "out"))
    assert line == f"error: {said}"
    assert list(tmp_path.iterdir()) == []


def test_an_empty_history_in_a_file_is_refused_before_any_file_is_written(world, tmp_path, capsys):
    users = write_histories(tmp_path / "users.jsonl", {"a": ["0"], "b": []})
    before = snapshot(tmp_path)
    line = refused(capsys, *command(world, "--histories", users, "--output_dir", tmp_path / "out"))
    assert line == (
        "error: user b has an empty history: the model recommends from what a user did; leave such users out "
        "(a popularity list is the usual answer for them)"
    )
    assert snapshot(tmp_path) == before


UNKNOWN = (
    "are not in the SID index (16 items); check the ids, add new items with `peft-grounded add-items` + "
    "`grow-adapter`, or skip unknown items (skip_unknown=True, --skip_unknown)"
)


@pytest.mark.parametrize(
    "history, skip, said",
    [
        ("0,zz,1", False, f"error: user history: items ['zz'] {UNKNOWN}"),
        ("zz,yy", False, f"error: user history: items ['zz', 'yy'] {UNKNOWN}"),
        (
            "zz,yy",
            True,
            "error: user history: none of the 2 history items is in the SID index (e.g. ['zz', 'yy']); with nothing "
            "known there is nothing to recommend from: check that the ids are this catalogue's",
        ),
    ],
    ids=["unknown", "all_unknown", "all_unknown_skipped"],
)
def test_unknown_history_items_are_named(world, tmp_path, capsys, history, skip, said):
    flags = ["--skip_unknown"] if skip else []
    line = refused(capsys, *command(world, "--history", history, "--output_dir", tmp_path / "out", *flags))
    assert line == said
    assert list(tmp_path.iterdir()) == []


def test_skip_unknown_serves_the_known_items_and_counts_the_rest(world, recommender, capsys):
    code, out, err = run_cli(capsys, *command(world, "--history", "0,zz,1", "--skip_unknown"))
    assert code == 0 and "skipped 1 unknown history items: ['zz']" in err
    assert printed_items(out) == recommender.recommend([["0", "1"]], k=K)[0].items


# ----------------------------------------------------------------------------------------- numbers


@pytest.mark.parametrize(
    "flag, value", [("--k", "0"), ("--k", "-3"), ("--num_beams", "0"), ("--decode_batch_size", "0")]
)
def test_a_count_below_one_is_refused_naming_the_flag(world, tmp_path, capsys, flag, value):
    line = refused(capsys, *command(world, "--history", "0", "--output_dir", tmp_path / "out"), flag, value)
    assert line == f"error: {flag} must be >= 1, got {value}"
    assert list(tmp_path.iterdir()) == []


def test_k_above_the_catalogue_writes_nothing_and_the_corrected_rerun_succeeds(
    world, finished, tmp_path, capsys
):
    users = write_histories(tmp_path / "users.jsonl", HISTORIES)
    out = tmp_path / "out"
    argv = command(world, "--histories", users, "--output_dir", out)
    line = refused(capsys, *argv, "--k", "17")
    assert line == "error: k=17 exceeds the catalogue's 16 items; lower k"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["users.jsonl"]  # no folder, no settings, no lock
    code, _, err = run_cli(capsys, *argv)
    assert code == 0 and f"3 users (3 decoded now) -> {out / OUTPUT}" in err
    assert (out / OUTPUT).read_bytes() == (finished / OUTPUT).read_bytes()
    assert sorted(p.name for p in out.iterdir()) == [OUTPUT, SETTINGS]


def test_k_equal_to_the_catalogue_serves_every_other_item(recommender):
    everything = {str(i) for i in range(16)}
    (left_out,) = recommender.recommend([["0", "1"]], k=16)
    assert sorted(left_out.items, key=int) == sorted(everything - {"0", "1"}, key=int)  # 14: fewer than k
    assert left_out.scores == sorted(left_out.scores, reverse=True)
    (kept,) = recommender.recommend([["0", "1"]], k=16, exclude_history=False)
    assert set(kept.items) == everything and len(kept.items) == 16


CANDIDATES = {  # candidates for the histories [["0", "1"], ["3"]] -> the ValueError's message
    "a_string": (
        "15",
        "candidates='15' is one string, not a collection of item ids: pass a list (['15'] for that one item), or one list per user",
    ),
    "bytes": (b"15", "candidates=b'15' is one string, not a collection of item ids"),
    "empty": ([], "candidates is empty: nothing to recommend from"),
    "empty_for_one_user": ([["4"], []], "candidates[1] is empty: nothing to recommend from"),
    "unknown": (["4", "zz"], "candidates: ['zz'] are not in the SID index; pass catalogue items"),
    "three_sets_for_two": (
        [["4"], ["5"], ["6"]],
        "3 candidate sets for 2 histories: give one per user, or one for all",
    ),
    "one_set_of_lists": ([["4"]], "1 candidate sets for 2 histories: give one per user, or one for all"),
    "none_among_items": (["4", None], "candidates hold [None], which are not item ids (strings or integers)"),
    "none_first": (
        [None, "4"],
        "candidates[0] is None: give one list of item ids per user, or one list for all",
    ),
    "none_for_one_user": (
        [["4"], None],
        "candidates[1] is None: give one list of item ids per user, or one list for all",
    ),
    "fewer_than_k": (["4", "4", "5"], "k=3 exceeds the candidate set's 2 items; lower k"),
}


@pytest.mark.parametrize("case", list(CANDIDATES))
def test_bad_candidates_are_named_before_decoding(recommender, case):
    candidates, said = CANDIDATES[case]
    with pytest.raises(ValueError) as caught:
        recommender.recommend([["0", "1"], ["3"]], k=K, candidates=candidates)
    assert str(caught.value).startswith(said), str(caught.value)


def test_candidates_as_numbers_and_repeats_are_served(recommender):
    lists = recommender.recommend([["0", "1"], ["3"]], k=K, candidates=[4, "5", "5", 6])
    assert [sorted(r.items) for r in lists] == [["4", "5", "6"], ["4", "5", "6"]]


# ----------------------------------------------------------------------------------------- damaged or foreign files


def refuse_adapter(capsys, world, folder: Path, *extra: str, history: str = "0,1") -> str:
    """``recommend`` of ``folder`` refused; the folder unchanged."""
    before = snapshot(folder)
    line = refused(capsys, *command(world, "--history", history, *extra, adapter=folder))
    assert snapshot(folder) == before
    return line


def test_a_truncated_adapter_config_names_the_file_and_the_place(world, tmp_path, capsys):
    adapter = copy(world["root"] / "adapter", tmp_path)
    config = adapter / "adapter_config.json"
    config.write_text(config.read_text()[:100])
    line = refuse_adapter(capsys, world, adapter)
    assert line.startswith(
        f"error: The folder '{adapter}' has an unreadable adapter_config.json: {config} is not valid JSON (line "
    )
    assert line.endswith(
        "truncated or corrupted?); save the adapter again (save_pretrained), or restore (or pull) a good copy"
    )


@pytest.mark.parametrize(
    "content, kind", [({"peft_type": "LORA"}, "a LORA"), (["GROUNDED_TOKENS"], "a non-PEFT")]
)
def test_an_adapter_config_of_another_kind_is_named(world, tmp_path, capsys, content, kind):
    adapter = copy(world["root"] / "adapter", tmp_path)
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(
        json.dumps(config | content if isinstance(content, dict) else content)
    )
    line = refuse_adapter(capsys, world, adapter)
    assert line == (
        f"error: The folder '{adapter}' holds {kind} adapter, not a grounded-token adapter (peft_type "
        "GROUNDED_TOKENS); load it with peft.PeftModel.from_pretrained instead."
    )


@pytest.mark.parametrize(
    "change, said",
    [
        (lambda c: c.update(surprise=1), " has missing fields [], unknown fields ['surprise']"),
        (lambda c: c.pop("token_indices"), " has missing fields ['token_indices'], unknown fields []"),
        (lambda c: c.update(provenance=[1]), ": field 'provenance' is [1], not an object"),
        (lambda c: c.update(token_indices="abc"), "token_indices must be integer row indices"),
        (lambda c: c.update(init_scale="big"), "init_scale must be a finite number > 0, got 'big'"),
    ],
    ids=[
        "extra_field",
        "missing_field",
        "provenance_not_an_object",
        "indices_not_ints",
        "scale_not_a_number",
    ],
)
def test_an_adapter_config_field_that_is_missing_unknown_or_mistyped_is_named(
    world, tmp_path, capsys, change, said
):
    adapter = copy(world["root"] / "adapter", tmp_path)
    path = adapter / "adapter_config.json"
    config = json.loads(path.read_text())
    change(config)
    path.write_text(json.dumps(config))
    line = refuse_adapter(capsys, world, adapter)
    if "fields" in said or "field 'provenance'" in said:
        assert line.startswith(f"error: The folder '{adapter}''s adapter_config.json{said}"), line
        assert line.endswith("save the adapter again (save_pretrained), or restore (or pull) a good copy")
    else:  # the config's own checks name the field
        assert said in line, line


def test_truncated_adapter_weights_are_named(world, tmp_path, capsys):
    adapter = copy(world["root"] / "adapter", tmp_path)
    weights = adapter / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    line = refuse_adapter(capsys, world, adapter)
    assert line == (
        f"error: {weights} cannot be read (Error while deserializing header: incomplete metadata, file not fully "
        "covered): truncated or corrupted; save the adapter again (or pull it again)"
    )


def test_a_sid_index_folder_that_is_a_link_is_loaded_through_it(world, recommender, tmp_path, capsys):
    adapter = copy(world["root"] / "adapter", tmp_path)
    shutil.rmtree(adapter / "sid_index")
    (adapter / "sid_index").symlink_to(world["root"] / "sids")  # the same index, kept elsewhere
    before = snapshot(adapter)
    code, out, _ = run_cli(capsys, *command(world, "--history", "0,1", adapter=adapter))
    assert code == 0 and printed_items(out) == recommender.recommend([["0", "1"]], k=K)[0].items
    assert snapshot(adapter) == before


def test_a_sid_index_link_to_a_folder_without_an_index_says_so(world, tmp_path, capsys):
    adapter = copy(world["root"] / "adapter", tmp_path)
    shutil.rmtree(adapter / "sid_index")
    (tmp_path / "empty").mkdir()
    (adapter / "sid_index").symlink_to(tmp_path / "empty")
    line = refuse_adapter(capsys, world, adapter)
    assert line == (
        f"error: {adapter / 'sid_index'} is a link to {tmp_path / 'empty'}, which holds no SID index "
        "(sid_index.json): point it at the index's folder, or pass the index (sid_index=..., --sid_index DIR)"
    )


def test_a_sid_index_link_to_nothing_says_where_it_points(world, tmp_path, capsys):
    adapter = copy(world["root"] / "adapter", tmp_path)
    shutil.rmtree(adapter / "sid_index")
    (adapter / "sid_index").symlink_to(tmp_path / "gone")
    before = snapshot(adapter)
    line = refuse_adapter(capsys, world, adapter)
    assert line == (
        f"error: {adapter / 'sid_index'} is a link to {tmp_path / 'gone'}, which is not a folder: point it at "
        "the index's folder, or pass the index (sid_index=..., --sid_index DIR)"
    )
    assert snapshot(adapter) == before


@pytest.mark.parametrize("damage", ["truncated", "item_ids_null"])
def test_a_damaged_index_json_names_the_file(world, tmp_path, capsys, damage):
    adapter = copy(world["root"] / "adapter", tmp_path)
    index = adapter / "sid_index" / "sid_index.json"
    if damage == "truncated":
        index.write_text(index.read_text()[:200])
        said = f"error: {index} is not valid JSON (line 1, column "
    else:
        index.write_text(json.dumps(json.loads(index.read_text()) | {"item_ids": None}))
        said = f"error: {index}: 'item_ids' must be list, got None (a damaged or foreign index)"
    line = refuse_adapter(capsys, world, adapter)
    assert line.startswith(said) and line.endswith(
        "rebuild it with `peft-grounded build-sids` (or restore a good copy)"
    )


def _rule_record(change):
    def edit(folder: Path) -> None:
        path = folder / "new_item_rule.json"
        record = json.loads(path.read_text())
        change(record)
        path.write_text(json.dumps(record))

    return edit


def _swap_vectors(folder: Path) -> None:
    from safetensors.numpy import save

    (folder / "new_item_rule.safetensors").write_bytes(save({"vectors": np.ones((19, 8), dtype=np.float32)}))


def _truncate_vectors(folder: Path) -> None:
    path = folder / "new_item_rule.safetensors"
    path.write_bytes(path.read_bytes()[:100])


RULE_DAMAGE = {  # how the stored rule is damaged -> what the error line says after "error: "
    "missing_field": (
        _rule_record(lambda r: r.pop("temperature")),
        "{json}: missing fields ['temperature'], unknown fields []; {fix}",
    ),
    "extra_field": (
        _rule_record(lambda r: r.update(colour="red")),
        "{json}: missing fields [], unknown fields ['colour']; {fix}",
    ),
    "mistyped_field": (
        _rule_record(lambda r: r.update(window="10")),
        "{json}: field 'window' is '10', not a positive integer; {fix}",
    ),
    "negative_reserved_places": (
        _rule_record(lambda r: r.update(min_places=-1)),
        "{json}: field 'min_places' is -1, not an integer >= 0; {fix}",
    ),
    "model_weight_out_of_range": (  # new items would drop out of every list: p_model^1e308
        _rule_record(lambda r: r.update(model_weight=1e308)),
        "{json}: field 'model_weight' is 1e+308, not a number between 0 and 10; {fix}",
    ),
    "weights_of_another_length": (
        _rule_record(lambda r: r.update(weights=[0.5])),
        "{json}: field 'weights' is [0.5], not a list of 3 numbers; {fix}",
    ),
    "items_reordered": (
        _rule_record(lambda r: r.update(item_ids=r["item_ids"][::-1])),
        "the new-item rule in folder '{folder}' lists the items of its SID index {fingerprint} in another order: it "
        "was edited or damaged; fit it again on this index (grow-adapter --interactions FILE, or recommend "
        "--interactions FILE)",
    ),
    "item_renamed": (
        _rule_record(lambda r: r.update(item_ids=["zero", *r["item_ids"][1:]])),
        "the new-item rule in folder '{folder}' lists other items than its SID index {fingerprint} (e.g. ['0', "
        "'zero']): it was edited or damaged; fit it again on this index",
    ),
    "vectors_truncated": (
        _truncate_vectors,
        "{tensors} is not the file new_item_rule.json was saved with; {fix}",
    ),
    "vectors_swapped": (_swap_vectors, "{tensors} is not the file new_item_rule.json was saved with; {fix}"),
    "vectors_missing": (
        lambda f: (f / "new_item_rule.safetensors").unlink(),
        "{folder} has new_item_rule.json but no new_item_rule.safetensors; {fix}",
    ),
}


@pytest.mark.parametrize("case", list(RULE_DAMAGE))
def test_a_damaged_new_item_rule_is_named(world, ruled, tmp_path, capsys, case):
    damage, said = RULE_DAMAGE[case]
    folder = copy(ruled, tmp_path)
    damage(folder)
    line = refuse_adapter(capsys, world, folder, history="0,new0")
    expected = said.format(
        json=folder / "new_item_rule.json",
        tensors=folder / "new_item_rule.safetensors",
        folder=folder,
        fingerprint=world["child"].fingerprint(),
        fix=RULE_FIX,
    )
    assert line.startswith(f"error: {expected}"), line


def test_the_stored_rule_serves_new_items(world, ruled, capsys):
    code, out, _ = run_cli(capsys, *command(world, "--history", "0,new0", adapter=ruled))
    served_ = GroundedRecommender.from_pretrained(ruled, num_beams=BEAMS).recommend([["0", "new0"]], k=K)[0]
    assert code == 0 and printed_items(out) == served_.items


@pytest.mark.parametrize(
    "change, said",
    [
        (
            lambda r: r.pop("prompt_format"),
            "{path}: missing fields ['prompt_format'], unknown fields []; {fix}",
        ),
        (
            lambda r: r.update(sid_index_fingerprint=5),
            "{path}: field 'sid_index_fingerprint' is 5, of the wrong type; {fix}",
        ),
        (lambda r: r.update(format=2), "{path} is of format 2, not 1; {fix}"),
        (
            lambda r: r.update(sid_token_ids=[True]),
            "{path}: sid_token_ids must be a non-empty list of token ids or null; {fix}",
        ),
    ],
    ids=["missing_field", "mistyped_field", "other_format", "rows_not_ids"],
)
def test_a_damaged_serving_record_of_a_merged_folder_is_named(world, merged, tmp_path, capsys, change, said):
    folder = copy(merged, tmp_path)
    path = folder / "grounded_serving.json"
    record = json.loads(path.read_text())
    change(record)
    path.write_text(json.dumps(record))
    line = refuse_adapter(capsys, world, folder)
    assert line == "error: " + said.format(path=path, fix=MERGED_FIX)


@pytest.mark.parametrize(
    "rows, said",
    [
        ([10**9], "names token ids beyond the model's {vocab} output rows (e.g. 1000000000)"),
        ([5, 6], "lacks {sids} of the SID index's tokens"),
    ],
    ids=["beyond_the_head", "not_the_sid_rows"],
)
def test_serving_rows_that_are_not_the_models_are_named(world, merged, tmp_path, capsys, rows, said):
    folder = copy(merged, tmp_path)
    path = folder / "grounded_serving.json"
    record = json.loads(path.read_text())
    record["sid_token_ids"] = rows
    path.write_text(json.dumps(record))
    line = refuse_adapter(capsys, world, folder)
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(folder).vocab_size
    said = said.format(vocab=vocab, sids=len(world["parent"].token_strings))
    assert line.startswith(f"error: {path}: sid_token_ids {said}"), line
    assert line.endswith(
        "so it is not this model's record; write the folder again with GroundedRecommender.save_merged"
    )


def test_a_merged_folder_without_its_record_is_refused_unless_told_how_it_decodes(
    world, merged, recommender, tmp_path, capsys
):
    folder = copy(merged, tmp_path)
    (folder / "grounded_serving.json").unlink()
    line = refuse_adapter(capsys, world, folder)
    assert line == (
        f"error: --adapter {folder} is a merged model without grounded_serving.json (which GroundedRecommender."
        "save_merged writes), so how it was trained to normalise each SID step is unknown and a guess serves other "
        "lists: pass --sid_softmax true (over the SID rows, sft's default) or --sid_softmax false (the whole "
        "vocabulary), as it was trained"
    )
    with pytest.raises(
        ValueError, match=r"has no grounded_serving\.json, so how it was trained to normalise"
    ):
        GroundedRecommender.from_pretrained(folder)
    # the adapter decodes over the whole vocabulary (it records no SID softmax): told so, the lists are its own
    with pytest.warns(UserWarning, match=r"has no grounded_serving\.json: the default prompt format is used"):
        code, out, _ = run_cli(
            capsys, *command(world, "--history", "0,1", "--sid_softmax", "false", adapter=folder)
        )
    assert code == 0 and printed_items(out) == recommender.recommend([["0", "1"]], k=K)[0].items


# ----------------------------------------------------------------------------------------- output folders


@pytest.mark.parametrize("names", [[OUTPUT], [PARTIAL], [OUTPUT, PARTIAL]], ids=["final", "partial", "both"])
def test_someone_elses_results_without_settings_are_refused_and_kept(world, tmp_path, capsys, names):
    users = write_histories(tmp_path / "users.jsonl", HISTORIES)
    out = tmp_path / "out"
    out.mkdir()
    for name in names:
        (out / name).write_text('{"user": "theirs", "items": ["42"]}\n')
    before = snapshot(tmp_path)
    line = refused(capsys, *command(world, "--histories", users, "--output_dir", out))
    found = ", ".join(names)
    assert line == (
        f"error: {out} holds {found} but no {SETTINGS}: they were not written by this command, or their settings "
        f"are lost, so nothing says what they hold. Choose another --output_dir, or delete {found} there to start "
        "over (nothing was changed)"
    )
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("kind", ["file", "link", "under_a_file"])
def test_an_output_dir_that_is_no_folder_is_refused(world, tmp_path, capsys, kind):
    users = write_histories(tmp_path / "users.jsonl", HISTORIES)
    (tmp_path / "notes.txt").write_text("keep me")
    out = {
        "file": tmp_path / "notes.txt",
        "link": tmp_path / "link",
        "under_a_file": tmp_path / "notes.txt" / "out",
    }[kind]
    if kind == "link":
        (tmp_path / "real").mkdir()
        out.symlink_to(tmp_path / "real")
    before = snapshot(tmp_path)
    line = refused(capsys, *command(world, "--histories", users, "--output_dir", out))
    assert (
        line
        == {
            "file": f"error: --output_dir {out} is a file; choose a folder",
            "link": f"error: --output_dir {out} is a link; choose a folder",
            "under_a_file": f"error: --output_dir {out}: {tmp_path / 'notes.txt'} is a file, so no folder can be made there; choose a folder",
        }[kind]
    )
    assert snapshot(tmp_path) == before


@pytest.mark.multiproc
@as_another_user
@pytest.mark.parametrize("kind", ["theirs", "own_read_only", "new_in_theirs"])
def test_an_output_folder_the_user_cannot_write_is_refused(world, finished, public_tmp, kind):
    users = write_histories(public_tmp / "users.jsonl", HISTORIES)
    mine = public_tmp / "mine"
    mine.mkdir()
    os.chown(mine, NOBODY, NOBODY)
    out = {
        "theirs": public_tmp / "theirs",
        "own_read_only": mine / "out",
        "new_in_theirs": public_tmp / "new",
    }[kind]
    if kind != "new_in_theirs":
        shutil.copytree(finished, out)
    if kind == "own_read_only":
        os.chown(out, NOBODY, NOBODY)
        out.chmod(0o555)
    before = snapshot(public_tmp)
    child = run_forked(main, command(world, "--histories", users, "--output_dir", out), user=NOBODY)
    unwritable = public_tmp if kind == "new_in_theirs" else out
    assert child.returncode == 2, child.err
    assert (
        f"error: --output_dir {out}: {unwritable} is not writable (Permission denied); choose a folder you "
        "can write" in child.err
    )
    assert "Traceback" not in child.err
    assert snapshot(public_tmp) == before


def test_a_finished_folder_rerun_with_the_same_histories_decodes_nobody(world, finished, tmp_path, capsys):
    out = copy(finished, tmp_path)
    users = write_histories(tmp_path / "users.jsonl", HISTORIES)
    code, _, err = run_cli(capsys, *command(world, "--histories", users, "--output_dir", out))
    assert code == 0 and f"3 users (0 decoded now) -> {out / OUTPUT}" in err
    assert snapshot(out) == snapshot(finished)


def test_a_finished_folder_rerun_with_changed_histories_decodes_those_users(
    world, recommender, finished, tmp_path, capsys
):
    out = copy(finished, tmp_path)
    changed = {"u2": ["3", "7", "8"], "u4": ["9"]}  # u2's history grew, u4 is new
    users = write_histories(tmp_path / "users.jsonl", HISTORIES | changed)
    code, _, err = run_cli(capsys, *command(world, "--histories", users, "--output_dir", out))
    assert code == 0 and f"4 users (2 decoded now) -> {out / OUTPUT}" in err
    old, new = (finished / OUTPUT).read_text().splitlines(), (out / OUTPUT).read_text().splitlines()
    assert [json.loads(line)["user"] for line in new] == ["u1", "u2", "u3", "u4"]
    assert (new[0], new[2]) == (old[0], old[2])  # u1 and u3 kept byte for byte
    expected = served(recommender, changed)
    assert {r["user"]: r["items"] for r in map(json.loads, (new[1], new[3]))} == expected
    assert json.loads(new[1])["key"] != json.loads(old[1])["key"]
    assert sorted(p.name for p in out.iterdir()) == [OUTPUT, SETTINGS]


@pytest.mark.parametrize(
    "flags, said",
    [
        (["--k", "4"], "k 3 then, 4 now"),
        (["--include_history"], "include_history False then, True now"),
        (["--num_beams", "4"], "num_beams 8 then, 4 now"),
        (["--sid_softmax", "false"], "sid_softmax None then, False now"),
    ],
    ids=["k", "include_history", "num_beams", "sid_softmax"],
)
def test_a_rerun_with_other_settings_is_refused_naming_them(world, finished, tmp_path, capsys, flags, said):
    out = copy(finished, tmp_path)
    users = write_histories(tmp_path / "users.jsonl", HISTORIES)
    before = snapshot(tmp_path)
    line = refused(capsys, *command(world, "--histories", users, "--output_dir", out), *flags)
    assert line == (
        f"error: {out} holds recommendations made with other settings ({said}); choose another --output_dir, or "
        f"delete {OUTPUT}* and {SETTINGS} in {out} to start over (nothing was changed)"
    )
    assert snapshot(tmp_path) == before


def test_damaged_settings_are_named_and_kept(world, finished, tmp_path, capsys):
    out = copy(finished, tmp_path)
    (out / SETTINGS).write_text('{"k": 3, ')
    users = write_histories(tmp_path / "users.jsonl", HISTORIES)
    before = snapshot(tmp_path)
    line = refused(capsys, *command(world, "--histories", users, "--output_dir", out))
    assert line.startswith(f"error: {out / SETTINGS} is not valid JSON (line 1, column ")
    assert line.endswith(f"delete {OUTPUT}* and {SETTINGS} in {out} to start over")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("damage, decoded", [("torn_last_line", 1), ("garbled_middle_line", 2)])
def test_a_partial_file_resumes_from_its_whole_lines(world, finished, tmp_path, capsys, damage, decoded):
    out = copy(finished, tmp_path)
    lines = (out / OUTPUT).read_text().splitlines(keepends=True)
    (out / OUTPUT).unlink()
    torn = (
        lines[0] + lines[1] + lines[2][:25]
        if damage == "torn_last_line"
        else lines[0] + "\x00garbage\n" + lines[2]
    )
    (out / PARTIAL).write_text(torn)
    users = write_histories(tmp_path / "users.jsonl", HISTORIES)
    code, _, err = run_cli(capsys, *command(world, "--histories", users, "--output_dir", out))
    assert code == 0 and f"3 users ({decoded} decoded now)" in err
    assert_same_lists(records(out), records(finished))  # decoded alone: scores differ by padding's rounding
    assert sorted(p.name for p in out.iterdir()) == [OUTPUT, SETTINGS]


def _partial_lines(path: Path) -> list[dict]:
    """The whole lines of a partial file (a line torn by a kill has no newline)."""
    text = path.read_text() if path.is_file() else ""
    return [json.loads(line) for line in text.split("\n")[:-1]]


@pytest.mark.multiproc
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl_c", "kill"])
def test_a_signal_while_decoding_keeps_whole_lines_and_the_rerun_finishes(
    world, many_served, tmp_path, capsys, sig
):
    users = write_histories(tmp_path / "users.jsonl", MANY)
    out = tmp_path / "out"
    argv = command(world, "--histories", users, "--output_dir", out, "--decode_batch_size", "1")
    child = start(main, argv)
    try:
        wait_for(lambda: len(_partial_lines(out / PARTIAL)) >= 1, child=child)
        line = refused(capsys, *argv)  # a second writer meanwhile is refused, naming the first
        assert (
            f"{out.resolve()} is being written by another peft-grounded process (pid {child.pid}, `recommend`"
            in line
        )
        wait_for(lambda: len(_partial_lines(out / PARTIAL)) >= 2, child=child)
        child.kill(sig)  # at once: the other users take a second or more
        code = child.wait(60)
    finally:
        child.kill()
    if sig == signal.SIGINT:
        assert code == 130 and "Traceback" not in child.err
        assert "interrupted: recommend stopped before it finished (Ctrl-C)" in child.err
        assert not lock_path(out).exists()
    else:
        assert code == -signal.SIGKILL and lock_path(out).exists()  # left behind, taken over below
    kept = _partial_lines(out / PARTIAL)
    assert 2 <= len(kept) < len(MANY) and not (out / OUTPUT).exists()
    assert [r["user"] for r in kept] == list(MANY)[: len(kept)]
    assert all(r["items"] == many_served[r["user"]] for r in kept)
    code, _, err = run_cli(capsys, *argv)
    assert code == 0 and f"{len(MANY)} users ({len(MANY) - len(kept)} decoded now)" in err
    assert {r["user"]: r["items"] for r in records(out)} == many_served
    assert [r["user"] for r in records(out)] == list(MANY)
    assert sorted(p.name for p in out.iterdir()) == [OUTPUT, SETTINGS] and not lock_path(out).exists()


@pytest.mark.multiproc
def test_ctrl_c_while_loading_writes_nothing(world, tmp_path):
    users = write_histories(tmp_path / "users.jsonl", MANY)
    out = tmp_path / "out"
    child = start(main, command(world, "--histories", users, "--output_dir", out))
    try:
        lock = lock_path(out)
        wait_for(lambda: lock.is_file() and str(child.pid) in lock.read_text(), child=child)
        time.sleep(0.05)  # the lock taken, the model loading (it takes several tenths of a second)
        child.kill(signal.SIGINT)
        code = child.wait(60)
    finally:
        child.kill()
    assert code == 130 and "interrupted: recommend stopped before it finished (Ctrl-C)" in child.err
    assert "Traceback" not in child.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["users.jsonl"]  # no folder, no lock


def hold(folder: Path, release: Path, command_name: str) -> int:
    """A child that holds ``folder``'s lock, as ``command_name`` does, until ``release`` exists."""
    with output_lock(folder, command_name):
        (release.parent / "held").write_text(str(os.getpid()))
        wait_for(release.exists, timeout=120)
    return 0


@pytest.fixture
def holder(tmp_path, request):
    """Another process holding ``tmp_path/target``'s lock as the command ``request.param``."""
    release = tmp_path / "release"
    child = start(hold, tmp_path / "target", release, request.param)
    wait_for((tmp_path / "held").exists, child=child)
    yield child
    release.touch()
    child.wait(60)


@pytest.mark.multiproc
@pytest.mark.parametrize("holder", ["recommend"], indirect=True)
def test_a_second_recommend_into_a_held_folder_is_refused(world, finished, holder, tmp_path, capsys):
    target = copy(finished, tmp_path, "target")
    users = write_histories(tmp_path / "users.jsonl", HISTORIES | {"u4": ["9"]})
    before = snapshot(target)
    line = refused(capsys, *command(world, "--histories", users, "--output_dir", target))
    assert line.startswith(
        f"error: {target.resolve()} is being written by another peft-grounded process (pid {holder.pid}, `recommend`"
    )
    assert line.endswith("Wait for it to finish, or choose another output folder.")
    assert snapshot(target) == before


# ----------------------------------------------------------------------------------------- the Hub


@pytest.mark.multiproc
@pytest.mark.parametrize("holder", ["pull"], indirect=True)
def test_pull_into_a_folder_another_process_holds_is_refused(holder, tmp_path, capsys):
    line = refused(capsys, "pull", "someone/grounded-adapter", tmp_path / "target")
    assert line.startswith(
        f"error: {(tmp_path / 'target').resolve()} is being written by another peft-grounded process (pid "
        f"{holder.pid}, `pull`"
    )
    assert not (tmp_path / "target").exists()


@pytest.mark.parametrize("overwrite", [False, True], ids=["plain", "overwrite"])
def test_pull_into_a_file_is_refused_and_keeps_it(tmp_path, capsys, overwrite):
    (tmp_path / "notes.txt").write_text("keep me")
    flags = ["--overwrite"] if overwrite else []
    line = refused(capsys, "pull", "someone/grounded-adapter", tmp_path / "notes.txt", *flags)
    assert line == (
        f"error: '{tmp_path / 'notes.txt'}' is a file, not a folder; pull into a folder (--overwrite replaces "
        "folders only)."
    )
    line = refused(capsys, "pull", "someone/grounded-adapter", tmp_path / "notes.txt" / "sub", *flags)
    assert line == (
        f"error: '{tmp_path / 'notes.txt'}' is a file, so no folder '{tmp_path / 'notes.txt' / 'sub'}' can be made; "
        "pull into a folder."
    )
    assert [(p.name, p.read_text()) for p in tmp_path.iterdir()] == [("notes.txt", "keep me")]


OFFLINE = (
    "Cannot reach https://huggingface.co/api/models/someone/grounded-adapter: offline mode is enabled. To disable "
    "it, please unset the `HF_HUB_OFFLINE` environment variable. HF_HUB_OFFLINE=1 is set, so the Hub is not "
    "contacted: unset it (or set it to 0) to push or pull, or load from a local folder"
)


def test_a_repo_id_with_the_hub_offline_is_refused_and_writes_nothing(world, tmp_path, capsys, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # as the tests' environment sets it
    users = write_histories(tmp_path / "users.jsonl", HISTORIES)
    argv = ["--histories", users, "--output_dir", tmp_path / "out"]
    line = refused(capsys, *command(world, *argv, adapter="someone/grounded-adapter"))
    assert (
        line
        == f"error: cannot load 'someone/grounded-adapter': {OFFLINE}. Nothing was written; a local folder of the adapter loads offline"
    )
    assert refused(capsys, "pull", "someone/grounded-adapter", tmp_path / "pulled") == f"error: {OFFLINE}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["users.jsonl"]  # no output folder, no pulled one


def test_pull_of_a_foreign_adapter_from_the_hub_leaves_nothing(world, hub_endpoint, tmp_path, capsys):
    from huggingface_hub import HfApi

    foreign = copy(world["root"] / "adapter", tmp_path, "foreign")
    config = json.loads((foreign / "adapter_config.json").read_text())
    (foreign / "adapter_config.json").write_text(json.dumps(config | {"peft_type": "LORA"}))
    HfApi().create_repo("tester/foreign")
    HfApi().upload_folder(repo_id="tester/foreign", folder_path=foreign)
    line = refused(capsys, "pull", "tester/foreign", tmp_path / "pulled")
    assert line.startswith(
        "error: The Hub repo 'tester/foreign' holds a LORA adapter, not a grounded-token adapter"
    )
    assert (
        sorted(p.name for p in tmp_path.iterdir() if "pulled" in p.name) == []
    )  # no folder, no temporary one


def test_a_pulled_adapter_serves_the_local_lists(world, recommender, hub_endpoint, tmp_path, capsys):
    from huggingface_hub import HfApi

    HfApi().create_repo("tester/grounded")
    HfApi().upload_folder(repo_id="tester/grounded", folder_path=world["root"] / "adapter")
    code, _, _ = run_cli(capsys, "pull", "tester/grounded", tmp_path / "pulled")
    assert code == 0
    assert {"adapter_config.json", "adapter_model.safetensors", "sid_index"} <= {
        p.name for p in (tmp_path / "pulled").iterdir()
    }
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    code, out, _ = run_cli(capsys, *command(world, "--history", "0,1", adapter=tmp_path / "pulled"))
    assert code == 0 and printed_items(out) == recommender.recommend([["0", "1"]], k=K)[0].items
