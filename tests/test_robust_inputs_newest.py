"""The newest files and settings are checked as the older ones are (issue 58): bad input is refused with one
``error: ...`` line (exit 2) naming the file or flag and the fix, never a traceback or a silent wrong result,
and nothing is written:

- a SASRec peer's ``sasrec.json`` that does not match its weights, or misses, adds or mistypes a field (its
  config's too), given to ``fuse-peer --peer`` or stored in an adapter's folder; a damaged cached fit is
  fitted again;
- ``peer_fusion.json`` with a field missing, unknown or of the wrong type;
- a peer fitted on other items than the SID index (``fuse-peer --peer``, a stored fusion, the API), and a
  fusion fitted for another index;
- numbers of the newest flags: ``sft --neftune_noise_alpha``, ``fuse-peer --weights / --reference_weight /
  --depth / --peer_seed``, ``grow-adapter --log_steps / --log_learning_rate``, ``build-sids
  --behaviour_weight``, refused at parse time (``--dry-run`` too);
- ``grow-adapter --overwrite`` into a fused adapter's folder drops the stale fusion, says so, and the grown
  adapter is served;
- behaviour item vectors of a catalogue without interactions or with histories too short;
- ``recommend --output_dir`` on a read-only file system keeps the system's reason;
- a new-item rule's ``model_weight`` out of range, given to the API.

The world (tiny base, toy SID index and its grown child, an adapter with its index, a tiny SASRec peer, the
adapter fused with it) is built once for the module; every command runs in-process.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from pathlib import Path

import pytest
from conftest import build_tiny_model
from helpers.robust_world import refused, run_cli, snapshot, toy_items, write_lcrec
from helpers.serving_fixtures import serving_world

from peft_grounded.serving.peer_fusion import FUSION_FILES, PeerFusion, PeerFusionError
from peft_grounded.sids.sasrec import SASRecConfig, SASRecRecommender, fit_sasrec

TINY_SASREC = SASRecConfig(hidden_size=16, max_epochs=2, batch_size=8, seed=1)
PEER_FIX = (
    "pass --peer a folder that SASRecRecommender.save wrote (e.g. OUTPUT_DIR/teacher of an sft run with "
    "--distill_weight), or omit --peer to fit one"
)


@pytest.fixture(scope="module")
def world(tmp_path_factory, smollm2_dir) -> dict:
    """``root/adapter`` (its index in ``sid_index/``), ``root/sids`` and ``root/sids-v2`` (3 new items), the
    LC-Rec catalogue ``root/cat/toy``, ``root/peer`` (SASRec over the index's items), ``root/other-peer``
    (over the grown index's items) and ``root/fused`` (the adapter fused with ``root/peer``)."""
    from helpers.toy_catalogue import toy_catalogue
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("newest")
    world = serving_world(root, AutoTokenizer.from_pretrained(smollm2_dir), build_tiny_model)
    catalogue = toy_catalogue()
    world["catalogue"] = write_lcrec(
        root / "cat", toy_items(), {u: list(s) for u, s in catalogue.sequences.items()}
    )
    split = catalogue.leave_one_out()
    fit_sasrec(split, world["parent"].item_ids, TINY_SASREC).save(root / "peer")
    fit_sasrec(split, world["child"].item_ids, TINY_SASREC).save(root / "other-peer")
    shutil.copytree(root / "adapter", root / "fused")
    peer = SASRecRecommender.load(root / "peer")
    PeerFusion(peer, 1.0, world["parent"].fingerprint(), depth=5).save(root / "fused")
    return world


def copy(source: Path, tmp_path: Path, name: str | None = None) -> Path:
    target = tmp_path / (name or source.name)
    shutil.copytree(source, target)
    return target


def edit_json(path: Path, change) -> None:
    record = json.loads(path.read_text())
    change(record)
    path.write_text(json.dumps(record))


def fuse_peer(world, adapter: Path, *extra) -> list:
    return [
        "fuse-peer",
        "--adapter",
        adapter,
        "--sid_index",
        adapter / "sid_index",
        "--catalogue",
        world["catalogue"],
        "--num_beams",
        "4",
        *extra,
    ]


def recommend(adapter: Path, *extra, history: str = "0,1") -> list:
    return ["recommend", "--adapter", adapter, "--history", history, "--k", "3", "--num_beams", "4", *extra]


def refuse_fuse_peer(capsys, world, tmp_path, peer: Path) -> str:
    """``fuse-peer --peer PEER`` of a copy of the adapter: refused, nothing written there or in the peer."""
    adapter = copy(world["root"] / "adapter", tmp_path)
    before, peer_before = snapshot(adapter.parent), snapshot(peer)
    line = refused(capsys, *fuse_peer(world, adapter, "--peer", peer))
    assert snapshot(adapter.parent) == before and snapshot(peer) == peer_before
    assert not (adapter / FUSION_FILES[0]).exists()
    return line


def refuse_served(capsys, folder: Path, *extra) -> str:
    """``recommend`` of ``folder`` refused; the folder unchanged."""
    before = snapshot(folder)
    line = refused(capsys, *recommend(folder, *extra))
    assert snapshot(folder) == before
    return line


def stored_fix(folder: Path) -> str:
    return (
        f"fit it again with `peft-grounded fuse-peer --adapter {folder} --sid_index SID_INDEX`, or delete "
        f"peer_fusion.json, sasrec.json and sasrec.safetensors from {folder} to serve the model alone"
    )


# ------------------------------------------------------------------------------ a peer's sasrec.json

SASREC_DAMAGE = {  # change to sasrec.json -> what the error line says after "error: "
    "shapes_of_another_config": (
        lambda r: r["config"].update(hidden_size=32),
        "{weights} does not hold the weights {json} describes (16 items, hidden_size 32, 2 blocks, max_length "
        "50): item_embedding.weight: (17, 16), wanted (17, 32)",
    ),
    "shapes_of_other_items": (
        lambda r: r.update(item_ids=r["item_ids"][:-2]),
        "{weights} does not hold the weights {json} describes (14 items,",
    ),
    "missing_field": (lambda r: r.pop("threads"), "{json}: missing fields ['threads'], unknown fields []"),
    "unknown_field": (lambda r: r.update(epochs=3), "{json}: missing fields [], unknown fields ['epochs']"),
    "mistyped_field": (
        lambda r: r.update(best_epoch="2"),
        "{json}: field 'best_epoch' is '2', not an integer >= 0",
    ),
    "item_ids_a_string": (
        lambda r: r.update(item_ids="0,1,2"),
        "{json}: field 'item_ids' is '0,1,2', not a non-empty list of distinct item-id strings",
    ),
    "config_missing_a_shape_field": (
        lambda r: r["config"].pop("num_blocks"),
        "{json}: field 'config' lacks ['num_blocks'] and has unknown fields []",
    ),
    "config_unknown_field": (
        lambda r: r["config"].update(layers=2),
        "{json}: field 'config' lacks [] and has unknown fields ['layers']",
    ),
    "config_mistyped_value": (
        lambda r: r["config"].update(dropout="0.5"),
        "{json}: field 'config': SASRecConfig: dropout must be in [0, 1), got '0.5'",
    ),
    "another_format": (lambda r: r.update(format="recbole"), "{json} is not a saved SASRec"),
}


@pytest.mark.parametrize("case", list(SASREC_DAMAGE))
def test_a_damaged_peer_given_to_fuse_peer_is_named(world, tmp_path, capsys, case):
    change, said = SASREC_DAMAGE[case]
    peer = copy(world["root"] / "peer", tmp_path, "peer")
    edit_json(peer / "sasrec.json", change)
    line = refuse_fuse_peer(capsys, world, tmp_path, peer)
    expected = said.format(json=peer / "sasrec.json", weights=peer / "sasrec.safetensors")
    assert line.startswith(f"error: {expected}"), line
    assert line.endswith(PEER_FIX), line


def test_a_missing_peer_folder_names_the_flag_and_the_fix(world, tmp_path, capsys):
    line = refuse_fuse_peer(capsys, world, tmp_path, tmp_path / "nowhere")
    assert line == (
        f"error: {tmp_path / 'nowhere'} holds no saved SASRec (sasrec.json and sasrec.safetensors); {PEER_FIX}"
    )


def test_a_stored_peer_edited_with_its_checksum_is_named(world, tmp_path, capsys):
    """A user who edits ``sasrec.json`` and ``peer_sha256`` both: the shapes are checked all the same."""
    folder = copy(world["root"] / "fused", tmp_path)
    edit_json(folder / "sasrec.json", lambda r: r["config"].update(hidden_size=8))
    digest = hashlib.sha256((folder / "sasrec.json").read_bytes()).hexdigest()
    edit_json(folder / "peer_fusion.json", lambda r: r.update(peer_sha256=digest))
    line = refuse_served(capsys, folder)
    assert line.startswith(
        f"error: {folder / 'sasrec.safetensors'} does not hold the weights {folder / 'sasrec.json'} describes"
    ), line
    assert line.endswith(stored_fix(folder)), line


def test_a_damaged_cached_fit_is_fitted_again(world, tmp_path, monkeypatch):
    """The shared fit (behaviour SIDs, the sft teacher, the peer) reads a damaged cache entry as a miss."""
    from helpers.toy_catalogue import toy_catalogue

    from peft_grounded.sids.sasrec_cache import shared_fit

    monkeypatch.setenv("PEFT_GROUNDED_CACHE", str(tmp_path))
    split, items = toy_catalogue().leave_one_out(), world["parent"].item_ids
    first = shared_fit(split, items, TINY_SASREC)
    (saved,) = (tmp_path / "sasrec").iterdir()
    edit_json(saved / "sasrec.json", lambda r: r["config"].update(hidden_size=32))  # the weights stay 16-d
    again = shared_fit(split, items, TINY_SASREC)
    assert again.config.hidden_size == 16 and again.history[0]["loss"] == pytest.approx(
        first.history[0]["loss"]
    )
    assert SASRecRecommender.load(saved).config.hidden_size == 16  # saved again, whole


def test_a_damaged_teacher_of_sft_is_fitted_again_not_a_traceback(world, tmp_path):
    """``sft --distill_weight``'s teacher in OUTPUT_DIR/teacher: a ``sasrec.json`` that does not fit its weights
    reads as no teacher (fitted again), as a missing one does."""
    from peft_grounded.training.sft.distillation import _load_teacher

    teacher = copy(world["root"] / "peer", tmp_path, "teacher")
    record = {"teacher_key": "key"}
    assert _load_teacher(teacher, record, "key").item_ids == world["parent"].item_ids
    edit_json(teacher / "sasrec.json", lambda r: r["config"].update(num_blocks=3))
    assert _load_teacher(teacher, record, "key") is None


# ------------------------------------------------------------------------------ peer_fusion.json

FUSION_DAMAGE = {  # change to peer_fusion.json -> what the error line says after "error: {json}: "
    "fitted_on_a_list": (
        lambda r: r.update(fitted_on=[1, 2]),
        "field 'fitted_on' is [1, 2], not an object (the validation table)",
    ),
    "unknown_field": (lambda r: r.update(note="mine"), "missing fields [], unknown fields ['note']"),
    "missing_field": (lambda r: r.pop("depth"), "missing fields ['depth'], unknown fields []"),
    "weight_a_string": (lambda r: r.update(weight="2"), "field 'weight' is '2', not a number > 0"),
    "weight_zero": (lambda r: r.update(weight=0), "field 'weight' is 0, not a number > 0"),
    "depth_a_fraction": (lambda r: r.update(depth=2.5), "field 'depth' is 2.5, not an integer >= 1"),
    "checksum_a_number": (
        lambda r: r.update(peer_sha256=7),
        "field 'peer_sha256' is 7, not a sha256 hex string",
    ),
}


@pytest.mark.parametrize("case", list(FUSION_DAMAGE))
def test_a_damaged_peer_fusion_json_is_named(world, tmp_path, capsys, case):
    change, said = FUSION_DAMAGE[case]
    folder = copy(world["root"] / "fused", tmp_path)
    edit_json(folder / "peer_fusion.json", change)
    line = refuse_served(capsys, folder)
    assert line == f"error: {folder / 'peer_fusion.json'}: {said}; {stored_fix(folder)}"


def test_evaluate_refuses_a_damaged_fusion_before_writing(world, tmp_path, capsys):
    folder = copy(world["root"] / "fused", tmp_path)
    edit_json(folder / "peer_fusion.json", lambda r: r.update(fitted_on="validation"))
    before = snapshot(tmp_path)
    line = refused(
        capsys, "evaluate", "--adapter", folder, "--sid_index", folder / "sid_index", "--catalogue",
        world["catalogue"], "--output_dir", tmp_path / "metrics", "--num_beams", "4",
    )  # fmt: skip
    assert "field 'fitted_on' is 'validation', not an object" in line and stored_fix(folder) in line
    assert snapshot(tmp_path) == before


# ------------------------------------------------------------------------------ a peer of other items


def test_fuse_peer_refuses_a_peer_of_other_items_naming_the_flag(world, tmp_path, capsys):
    peer = world["root"] / "other-peer"
    adapter = tmp_path / "adapter"
    line = refuse_fuse_peer(capsys, world, tmp_path, peer)
    assert line == (
        f"error: --peer {peer}: the peer there was fitted on other items than the SID index "
        f"{adapter / 'sid_index'} (19 items against the index's 16; 3 of the peer's are not in the index, e.g. "
        "['new0', 'new1', 'new2']); pass the peer fitted for this index (e.g. OUTPUT_DIR/teacher of an sft run "
        "on it), or omit --peer to fit one"
    )


def test_a_stored_peer_of_other_items_says_how_to_fit_it_again(world, tmp_path, capsys):
    folder = copy(world["root"] / "adapter", tmp_path)
    other = SASRecRecommender.load(world["root"] / "other-peer")
    PeerFusion(other, 1.0, world["parent"].fingerprint()).save(folder)  # the right fingerprint, other items
    line = refuse_served(capsys, folder)
    assert line == (
        f"error: the peer in folder {str(folder)!r} was fitted on other items than the SID index "
        f"{world['parent'].fingerprint()} (19 items against the index's 16; 3 of the peer's are not in the "
        f"index, e.g. ['new0', 'new1', 'new2']); {stored_fix(folder)}"
    )
    assert "edited or damaged" not in line and "the given peer" not in line


def test_a_stored_fusion_for_another_index_says_how_to_fit_it_again(world, tmp_path, capsys):
    folder = copy(world["root"] / "fused", tmp_path)
    edit_json(folder / "peer_fusion.json", lambda r: r.update(sid_index_fingerprint="0123abcd"))
    line = refuse_served(capsys, folder)
    assert line == (
        f"error: the peer fusion in folder {str(folder)!r} was fitted for SID index 0123abcd, not for this one "
        f"({world['parent'].fingerprint()}); {stored_fix(folder)}"
    )


def test_the_api_names_a_peer_of_other_items_plainly(world):
    from peft_grounded.evaluation.peers import fit_peer_fusion

    other = SASRecRecommender.load(world["root"] / "other-peer")
    with pytest.raises(PeerFusionError) as caught:  # refused before any decoding
        fit_peer_fusion(None, None, world["parent"], None, other)
    assert str(caught.value).startswith(
        f"the peer was fitted on other items than the SID index {world['parent'].fingerprint()} (19 items "
        "against the index's 16"
    )
    reordered = SASRecRecommender.load(world["root"] / "peer")
    reordered.item_ids = reordered.item_ids[::-1]
    with pytest.raises(PeerFusionError, match="the same 16 items in another order"):
        PeerFusion(reordered, 1.0, world["parent"].fingerprint()).check_index(world["parent"], "here")
    with pytest.raises(PeerFusionError, match="fitted_on is a dict"):
        PeerFusion(reordered, 1.0, "x", fitted_on=[1])


# ------------------------------------------------------------------------------ the newest numbers

NUMBERS = {  # command -> {case: (flags, words the error line holds)}
    "sft": {
        "neftune_negative": (
            ["--neftune_noise_alpha", "-1"],
            ["neftune_noise_alpha must be a finite number > 0 or None, got -1.0", "--neftune_noise_alpha"],
        ),
        "neftune_zero": (["--neftune_noise_alpha", "0"], ["neftune_noise_alpha", "> 0", "got 0.0"]),
        "neftune_nan": (["--neftune_noise_alpha", "nan"], ["neftune_noise_alpha", "nan"]),
    },
    "fuse-peer": {
        "weights_negative": (["--weights", "0.5", "-1"], ["--weights are numbers > 0", "[0.5, -1.0]"]),
        "weights_nan": (["--weights", "nan"], ["--weights are numbers > 0", "nan"]),
        "reference_zero": (["--reference_weight", "0"], ["--reference_weight is a number > 0", "got 0.0"]),
        "depth_zero": (["--depth", "0"], ["--depth is an integer >= 1, got 0"]),
        "peer_seed_negative": (
            ["--peer_seed", "-1"],
            ["peer_seed", "--peer_seed", "between 0 and 4294967295"],
        ),
    },
    "grow-adapter": {
        "log_steps_negative": (["--log_steps", "-2"], ["log_steps", "--log_steps", ">= 0", "-2"]),
        "log_lr_zero": (["--log_learning_rate", "0"], ["log_learning_rate", "--log_learning_rate", "> 0"]),
        "log_lr_nan": (["--log_learning_rate", "nan"], ["log_learning_rate", "nan"]),
        "log_steps_without_interactions": (
            ["--log_steps", "3"],
            ["--log_steps tunes the new items' rows", "--interactions FILE"],
        ),
    },
    "build-sids": {
        "behaviour_weight_one": (
            ["--item_vectors", "mix", "--behaviour_weight", "1"],
            ["behaviour_weight", "--behaviour_weight", "< 1"],
        ),
        "behaviour_epochs_zero": (["--behaviour_epochs", "0"], ["behaviour_epochs", "--behaviour_epochs"]),
    },
}


def command_args(world, name: str, out: Path) -> list:
    root = world["root"]
    return {
        "sft": ["sft", "--model_name_or_path", world["base"], "--sid-index", root / "sids", "--catalogue",
                world["catalogue"], "--max_steps", "1", "--output_dir", out],
        "fuse-peer": fuse_peer(world, out),
        "grow-adapter": ["grow-adapter", "--adapter", root / "adapter", "--parent-index", root / "sids",
                         "--sid-index", root / "sids-v2", "--output_dir", out],
        "build-sids": ["build-sids", "--catalogue", world["catalogue"], "--encoder", f"lm:{world['base']}",
                       "--codes", "4", "--levels", "2", "--no-progress", "--output_dir", out],
    }[name]  # fmt: skip


@pytest.mark.parametrize("name, case", [(name, case) for name, cases in NUMBERS.items() for case in cases])
@pytest.mark.parametrize("dry_run", [False, True], ids=["run", "dry_run"])
def test_a_newest_number_out_of_range_is_refused_at_parse_time(world, tmp_path, capsys, name, case, dry_run):
    flags, words = NUMBERS[name][case]
    out = tmp_path / "out"
    if name == "fuse-peer":  # writes into the adapter's folder
        out = copy(world["root"] / "adapter", tmp_path, "out")
    before, mine = snapshot(world["root"]), snapshot(tmp_path)
    line = refused(capsys, *command_args(world, name, out), *flags, *(["--dry-run"] if dry_run else []))
    for word in words:
        assert word in line, (word, line)
    assert snapshot(world["root"]) == before and snapshot(tmp_path) == mine


def test_grow_adapter_into_the_api_refuses_a_learning_rate_out_of_range(world, tmp_path):
    from peft_grounded.checks import SettingsError
    from peft_grounded.cli.growth import grow_adapter_into

    root = world["root"]
    with pytest.raises(SettingsError, match=r"log_learning_rate must be a finite number > 0, got -0.1"):
        grow_adapter_into(
            root / "adapter", root / "sids", root / "sids-v2", tmp_path / "x", log_learning_rate=-0.1
        )
    assert not (tmp_path / "x").exists()


# ------------------------------------------------------------------------------ grow-adapter over a fusion


def test_grow_adapter_over_a_fused_adapter_drops_its_fusion_and_the_grown_one_is_served(
    world, tmp_path, capsys
):
    root = world["root"]
    out = copy(root / "fused", tmp_path, "out")
    (out / "notes.txt").write_text("keep me")
    argv = ["grow-adapter", "--adapter", root / "adapter", "--parent-index", root / "sids", "--sid-index",
            root / "sids-v2", "--output_dir", out, "--overwrite"]  # fmt: skip
    code, stdout, err = run_cli(capsys, *argv)
    assert code == 0, err
    assert (
        f"dropped the peer fusion of the adapter replaced in {out} (peer_fusion.json, sasrec.json, "
        f"sasrec.safetensors): it was fitted for the parent's SID index; run `peft-grounded fuse-peer --adapter "
        f"{out} --sid_index {root / 'sids-v2'}` again" in err
    )
    assert json.loads(stdout.splitlines()[0])["dropped"] == list(FUSION_FILES)
    assert not any((out / name).exists() for name in FUSION_FILES)
    assert (out / "notes.txt").read_text() == "keep me"
    code, stdout, err = run_cli(capsys, *recommend(out, "--sid_index", root / "sids-v2", history="0,new0"))
    assert code == 0, err
    assert "peer fusion" not in err


# ------------------------------------------------------------------------------ behaviour item vectors


@pytest.mark.parametrize(
    "sequences, said",
    [
        ({}, "and the catalogue 'toy' holds no interactions"),
        (
            {"u1": ["0", "1"], "u2": ["2", "3"]},
            "and no user of the catalogue 'toy' has 4 items (the longest has 2; 2 users, 4 interactions)",
        ),
        (
            {"u1": ["0", "1", "2"], "u2": ["3", "4", "5"]},
            "and no user of the catalogue 'toy' has 4 items (the longest has 3; 2 users, 6 interactions)",
        ),
    ],
    ids=["no_interactions", "histories_of_two", "histories_of_three"],
)
def test_behaviour_vectors_without_enough_interactions_say_what_they_need(
    world, tmp_path, capsys, sequences, said
):
    catalogue = write_lcrec(tmp_path / "cat", toy_items(), sequences)
    out = tmp_path / "sids"
    before = snapshot(tmp_path)
    argv = command_args(world, "build-sids", out)
    argv[argv.index("--catalogue") + 1] = catalogue
    line = refused(capsys, *argv, "--no-cache", "--item_vectors", "behaviour")
    assert line.startswith(
        "error: --item_vectors behaviour builds the SIDs from SASRec's item embeddings, learnt from the users' "
        "interactions"
    ), line
    assert said in line, line
    assert line.endswith("or use --item_vectors text, which needs none"), line
    assert snapshot(tmp_path) == before and not out.exists()


# ------------------------------------------------------------------------------ recommend's output folder


@pytest.fixture
def read_only_mount(tmp_path):
    """A real read-only file system (a tmpfs mounted ``ro``); skipped where mounting is not allowed."""
    import subprocess

    folder = tmp_path / "ro"
    folder.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(folder)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_a_read_only_file_system_is_named_as_the_system_names_it(world, tmp_path, capsys, read_only_mount):
    """Root ignores permissions but not a read-only mount: the system's reason reaches the line."""
    out = read_only_mount / "out"
    users = tmp_path / "users.jsonl"
    users.write_text('{"user": "a", "history": ["0", "1"]}\n')
    before = snapshot(tmp_path)
    line = refused(
        capsys, *recommend(world["root"] / "adapter")[:3], "--histories", users, "--output_dir", out
    )
    assert line == (
        f"error: --output_dir {out}: {read_only_mount} is not writable (Read-only file system); choose a folder "
        "you can write"
    )
    assert snapshot(tmp_path) == before


# ------------------------------------------------------------------------------ a new-item rule's model weight


def test_a_model_weight_out_of_range_is_refused_by_the_api(world):
    from peft_grounded.new_items import NewItemRule
    from peft_grounded.new_items.rule import NewItemRuleError

    logged = [["0", "4", "new0"], ["1", "new0", "new1"], ["2", "6"], ["3", "new2"]]
    rule = NewItemRule.fit(world["child"], logged)
    for bad in (1e308, math.inf, -0.5, 10.5):
        with pytest.raises(NewItemRuleError, match=r"model_weight=.*: give a number between 0 and 10"):
            NewItemRule(rule.mixture, rule.index_fingerprint, model_weight=bad)
    assert NewItemRule(rule.mixture, rule.index_fingerprint, model_weight=10.0).model_weight == 10.0
    rule.model_weight = 1e308  # set after the rule was made: refused where it would serve
    with pytest.raises(NewItemRuleError, match="between 0 and 10"):
        rule.apply(None, [["0"]], 3)
