"""The new-item protocol script's defaults, scoring and (paired) bootstrap intervals; no model runs. Which
items are new, which users are scored, and the controls of the served rule:
tests/test_bench_new_item_protocol.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest


@pytest.fixture(scope="module")
def protocol():
    from benchmarks import bench_grow_protocol

    return bench_grow_protocol


def test_defaults_are_the_cpu_protocol(protocol, monkeypatch):
    """The defaults; the precision follows the machine (peft_grounded.precision decides, as on any CPU), so it is
    compared with that decision, never with what one CPU gives."""
    import torch

    from peft_grounded.precision import choose_precision

    args = protocol.parse_args(["--out", "x"])
    assert (args.prompt.objective, args.prompt.max_history, args.training.max_length) == ("sequence", 19, 128)
    training = args.training
    assert (args.model.lora_r, args.model.lora_alpha) == (8, 16) and not training.sid_softmax
    assert (training.learning_rate, training.per_device_train_batch_size, training.seed) == (1e-3, 8, 0)
    assert (args.sids.levels, args.sids.codes, args.model.layers) == (3, "64", 0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    assert args.fp32 == (not choose_precision(device).bf16)  # the machine's choice, whatever the CPU
    assert args.users == 0 and args.data.max_examples is None  # all users, all rows
    assert args.minutes > 0 and not args.smoke
    assert args.replay == [0.0, 1.0] and args.old_users == 200  # with and without old items' pairs
    assert args.new_item_share == [0.1, 0.2] and args.match_levels is None and args.serving.num_beams == 20
    assert protocol.parse_args(["--out", "x", "--replay"]).replay == []  # no incremental grounding
    for bad in (["--num-beams", "5"], ["--new-item-share", "1.5"]):
        with pytest.raises(SystemExit):
            protocol.parse_args(["--out", "x", *bad])
    prompt = protocol.parse_args(["--out", "x", "--objective", "prompt"])
    assert (prompt.prompt.max_history, prompt.training.max_length) == (10, 256)
    smoke = protocol.parse_args(["--out", "x", "--smoke"])
    assert smoke.minutes < 1 and smoke.users > 0 and 0 < smoke.old_users < args.old_users
    assert smoke.data.max_examples == 64 and protocol.protocol_budget(smoke).max_train_examples == 64
    assert "SMOKE" in protocol.plan(smoke, grounds=False)
    for name in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS"):  # an AVX2 CPU
        monkeypatch.setenv(name, "avx2")
    assert protocol.parse_args(["--out", "x"]).fp32  # float32 there


@pytest.mark.parametrize("forced", [["--bf16"], ["--no-bf16"]])
def test_forced_precision_ignores_the_machine(protocol, forced):
    assert protocol.parse_args(["--out", "x", *forced]).fp32 == (forced == ["--no-bf16"])


def test_a_centroid_run_without_grounding_minutes_builds_its_budget_before_any_work(protocol):
    """BENCHMARKS' Office command (--minutes 0 --sft-steps 100, centroid: no grounding) once built SIDs for 15
    minutes and then failed on a GroundingConfig of 0 steps; the budget is now built at parse time, without a
    grounding stage for a strategy that does not ground, and a bad one fails there."""
    argv = ["--out", "x", "--minutes", "0", "--sft-steps", "100", "--no-retrained", "--replay", "--seed", "0"]
    budget = protocol.protocol_budget(protocol.parse_args(argv))
    assert budget.grounding is None and budget.sft.max_steps == 100
    grounding = protocol.protocol_budget(protocol.parse_args([*argv, "--strategy", "centroid_gti"]))
    assert grounding.grounding is not None and grounding.grounding.max_minutes == 2.0
    with pytest.raises(ValueError, match="max_steps"):  # a budget that cannot run stops at parse time
        protocol.parse_args(["--out", "x", "--minutes", "0", "--sft-steps", "0"])


def test_score_per_user_and_slot_share(protocol):
    predictions = [["a", "n1", "b"], ["b", "c", "d"], ["n2", "a", "b"]]
    result = protocol.score(predictions, ["n1", "n9", "n2"], {"n1", "n2", "n9"}, k=3)
    assert result["recall@3"] == pytest.approx(2 / 3)
    assert result["per_user"]["rank"].tolist() == [2, 0, 1]
    assert result["per_user"]["ndcg@3"].tolist() == pytest.approx([1 / np.log2(3), 0.0, 1.0])
    assert result["ndcg@3"] == pytest.approx(result["per_user"]["ndcg@3"].mean())
    assert result["new_item_slot_share"] == pytest.approx(2 / 9)


def test_bootstrap_is_paired_and_seeded(protocol):
    rng = np.random.default_rng(1)
    a = rng.random(40)
    b = a + 0.1  # b is a shifted by a constant: the paired differences are exactly 0.1
    lo, hi = protocol.interval(b - a, seed=3, rounds=500)
    assert lo == pytest.approx(0.1) and hi == pytest.approx(0.1)
    lo, hi = protocol.interval(a, seed=3, rounds=500)
    assert lo < a.mean() < hi
    assert protocol.interval(a, seed=3, rounds=500) == (lo, hi)  # seeded
    assert all(np.isnan(protocol.interval(np.array([]), seed=3, rounds=500)))


@pytest.fixture(scope="module")
def pooling():
    from benchmarks import pool_grow_protocol

    return pool_grow_protocol


def _run(tmp_path, seed, ranks, users=("u1", "u2", "u3", "u4")):
    folder = tmp_path / f"s{seed}"
    folder.mkdir()
    targets = [f"n{i}" for i in range(len(users))]
    summary = {
        "dataset": "toy",
        "budget": {"seed": seed},
        "per_user": {"users": list(users), "targets": targets, "rank_of_target": ranks},
    }
    (folder / "protocol.json").write_text(json.dumps(summary))
    return str(folder)


def test_pool_means_over_seeds_and_pairs_users_within_seeds(pooling, tmp_path):
    a = _run(tmp_path, 0, {"grown": [1, 0, 0, 0], "retrained (full catalogue)": [1, 3, 0, 0]})
    b = _run(tmp_path, 1, {"grown": [0, 2, 0, 0], "retrained (full catalogue)": [0, 2, 0, 0]})
    pooled = pooling.pool(pooling.load_runs([a, b]), None, k=10, resamples=500)
    assert pooled["seeds"] == [0, 1] and pooled["users"] == 4
    assert pooled["models"]["grown"]["recall@10"][0] == pytest.approx(2 / 8)
    assert pooled["models"]["retrained (full catalogue)"]["recall@10"][0] == pytest.approx(3 / 8)
    diff = pooled["paired_differences"]["grown - retrained"]["recall@10"]
    assert diff[0] == pytest.approx(-1 / 8) and diff[1] <= diff[0] <= diff[2]
    assert pooled["models"]["grown"]["ndcg@10"][0] == pytest.approx((1 + 1 / np.log2(3)) / 8)
    assert "grown - retrained" in pooling.markdown(pooled, 10)
    only = pooling.pool(pooling.load_runs([a, b]), ["grown"], k=10, resamples=100)
    assert list(only["models"]) == ["grown"] and not only["paired_differences"]


def test_pool_refuses_other_users_repeated_seeds_and_unknown_models(pooling, tmp_path):
    a = _run(tmp_path, 0, {"grown": [1, 0]}, users=("u1", "u2"))
    other = _run(tmp_path, 1, {"grown": [1, 0]}, users=("u1", "u3"))
    with pytest.raises(SystemExit, match="other users or targets"):
        pooling.load_runs([a, other])
    same_seed = tmp_path / "again"
    same_seed.mkdir()
    (same_seed / "protocol.json").write_text((Path(a) / "protocol.json").read_text())
    with pytest.raises(SystemExit, match="repeat a seed"):
        pooling.load_runs([a, str(same_seed)])
    b = _run(tmp_path, 2, {"grown": [0, 0], "slots": [1, 0]}, users=("u1", "u2"))
    with pytest.raises(SystemExit, match="not scored by every run"):
        pooling.pool(pooling.load_runs([a, b]), ["slots"], k=10, resamples=10)


@pytest.mark.parametrize("item_vectors", ["text", "behaviour"])
def test_the_protocol_sids_are_built_on_the_old_items_and_grown_by_the_new(protocol, item_vectors):
    """``--item-vectors``: the old items' index from their text or from the behaviour of their interactions only
    (SASRec on the old catalogue), the new items added from their text (through the map on a behaviour index),
    and the same codes when rebuilt (so a protocol run resumes on them)."""
    from helpers.shop import shop_catalogue

    from peft_grounded.new_items import add_items
    from peft_grounded.sids import build_sids

    catalogue, text = shop_catalogue()
    new_ids = ["i18", "i19", "i38", "i39"]
    old = catalogue.subset([i for i in catalogue.items if i not in new_ids])
    argv = ["--out", "x", "--item-vectors", item_vectors, "--levels", "2", "--codes", "4", "--no-retrained"]
    args = protocol.parse_args(argv)
    fingerprint = {"kind": "toy", "model": "shop"}
    parent, child, full, _ = protocol.protocol_indices(catalogue, old, new_ids, text, args, fingerprint)
    assert full is None  # --no-retrained: no reference index is built
    assert parent.item_ids == list(old.items) and sorted(child.item_ids) == sorted(catalogue.items)
    assert all(len(child.sid_of(i)) > 0 for i in new_ids)
    again = protocol.protocol_indices(catalogue, old, new_ids, text, args, fingerprint)
    assert (again[0].fingerprint(), again[1].fingerprint()) == (parent.fingerprint(), child.fingerprint())
    keep = [i for i, item in enumerate(catalogue.items) if item not in new_ids]
    if item_vectors == "text":  # the protocol's SIDs as before the setting: text vectors of the old items
        plain = build_sids(
            old, vectors=text[keep], levels=2, codes=4, encoder_fingerprint=fingerprint, show_progress=False
        )
        assert plain.fingerprint() == parent.fingerprint()
        assert "behaviour_map_r2" not in parent.quality
    else:
        assert "behaviour_map_r2" in parent.quality and parent.vector_map is not None
        # the new items were coded through the old index's text-to-behaviour map, as add_items does
        direct = add_items(
            parent, [catalogue.items[i] for i in new_ids], vectors=text[[18, 19, 38, 39]], encoder=fingerprint
        )
        assert direct.fingerprint() == child.fingerprint()


def _protocol(tmp_path, name, new_ranks, old_ranks, old_users=("o1", "o2"), population=(4, 8)):
    folder = tmp_path / name
    folder.mkdir()
    summary = {
        "dataset": "toy",
        "budget": {"seed": 0, "out": str(folder)},
        "new_item_test_users": population[0],
        "old_item_users": {"scored": len(old_users), "of": population[1]},
        "per_user": {
            "users": ["u1", "u2", "u3", "u4"],
            "targets": ["n1", "n2", "n3", "n4"],
            "rank_of_target": new_ranks,
            "old_item_users": list(old_users),
            "old_item_rank_of_target": old_ranks,
        },
    }
    (folder / "protocol.json").write_text(json.dumps(summary))
    return str(folder)


def test_two_protocol_runs_are_paired_per_user_and_group(tmp_path):
    """``compare_grow_protocol``: first - second per user on the new-item and the old-item users, and over all
    users with the groups at their population shares (here 4 of 12 users have a new-item target)."""
    from benchmarks import compare_grow_protocol as compare

    a = _protocol(
        tmp_path,
        "behaviour",
        {"served": [1, 0, 3, 0], "knn": [0, 0, 0, 0]},
        {"served": [2, 0], "knn": [0, 1]},
    )
    b = _protocol(
        tmp_path, "text", {"served": [0, 0, 3, 12], "knn": [0, 0, 0, 0]}, {"served": [2, 2], "knn": [0, 1]}
    )
    result = compare.compare(*compare.load_pair(a, b), None, k=10, resamples=500)
    served = result["models"]["served"]
    assert served["new_first"] == [0.5] and served["new_second"] == [0.25]
    assert served["new_difference"][0] == pytest.approx(0.25)
    assert served["old_difference"][0] == pytest.approx(-0.5)
    assert served["all_difference"][0] == pytest.approx(0.25 / 3 - 0.5 * 2 / 3)
    assert result["models"]["knn"]["new_difference"][:1] == [0.0]
    assert "behaviour - text" in compare.markdown(result, 10)
    with pytest.raises(SystemExit, match="not scored by both runs"):
        compare.compare(*compare.load_pair(a, b), ["slots"], k=10, resamples=10)
    other = _protocol(tmp_path, "other", {"served": [1, 0, 3, 0]}, {"served": [2, 0]}, old_users=("o1", "o3"))
    with pytest.raises(SystemExit, match="other users or targets"):
        compare.load_pair(a, other)


def test_the_cpu_recipe_flags_reach_the_budget(protocol):
    args = protocol.parse_args(["--out", "x", "--layers", "8", "--sid-softmax", "--init-scale", "0.1"])
    budget = protocol.protocol_budget(args)
    assert budget.sft.sid_softmax and budget.start.init_scale == 0.1 and args.model.layers == 8
    assert "the first 8 blocks, SID-only softmax, init_scale 0.1" in protocol.plan(args, grounds=False)
    plain = protocol.protocol_budget(protocol.parse_args(["--out", "x"]))
    assert not plain.sft.sid_softmax and plain.start.init_scale == 1.0
    with pytest.raises((SystemExit, ValueError), match="init_scale"):
        protocol.protocol_budget(protocol.parse_args(["--out", "x", "--init-scale", "-1"]))
    # RowStart and ItemVectorsConfig are the package's, parsed as they are; the strategy chooses the init
    mixed = protocol.parse_args(["--out", "x", "--centroid-variant", "codebook", "--item-vectors", "mix"])
    assert protocol.protocol_budget(mixed).start.centroid_variant == "codebook"
    assert (
        mixed.vectors.item_vectors,
        plain.start,
        protocol.parse_args(["--out", "x"]).vectors.item_vectors,
    ) == ("mix", protocol.RowStart(), "text")
    with pytest.raises(SystemExit, match="--init centroid: the strategy starts the rows"):
        protocol.parse_args(["--out", "x", "--init", "centroid"])


def test_the_package_flags_reach_the_budget_and_the_record(protocol):
    """The package's fields, parsed under the package's flags (BENCHMARKS' recipe commands give
    ``--learning-rate 3e-3``), reach both stages; ``protocol.json`` records every setting flat under its flag's
    name, JSON as it is (the pooling and comparing scripts read its ``seed`` and ``out``)."""
    argv = ["--out", "x", "--strategy", "centroid_gti", "--learning-rate", "3e-3", "--seed", "2"]
    argv += [
        "--per-device-train-batch-size",
        "4",
        "--lora-r",
        "4",
        "--lora-alpha",
        "8",
        "--max-examples",
        "32",
    ]
    args = protocol.parse_args(argv)
    budget = protocol.protocol_budget(args)
    assert budget.sft.learning_rate == budget.grounding.learning_rate == 3e-3 and budget.seed == 2
    assert budget.sft.per_device_train_batch_size == budget.grounding.per_device_train_batch_size == 4
    assert (budget.lora["r"], budget.lora["lora_alpha"], budget.max_grounding_examples) == (4, 8, 32)
    record = json.loads(json.dumps(protocol.record(args)))
    assert (record["seed"], record["out"], record["learning_rate"], record["init_scale"]) == (
        2,
        "x",
        3e-3,
        1.0,
    )
    assert record["item_vectors"] == "text" and record["max_history"] == 19 and record["codes"] == "64"
    with pytest.raises(ValueError, match="--lr"):  # the flag the script once declared: the package's now
        protocol.parse_args(["--out", "x", "--lr", "3e-3"])


def test_pool_pairs_the_arms_with_the_controls_and_weighs_all_users_by_their_shares(pooling, tmp_path):
    runs = []
    for seed, (new, old) in enumerate((([1, 0, 0, 0], [1, 0]), ([1, 2, 0, 0], [0, 0]))):
        folder = Path(_run(tmp_path, seed, {"grown + rule": new, "control": [0, 0, 0, 1]}))
        summary = json.loads((folder / "protocol.json").read_text())
        summary["all_users"] = {"new_item_user_share": 0.25}
        summary["per_user"]["old_item_rank_of_target"] = {"grown + rule": old, "control": [1, 1]}
        (folder / "protocol.json").write_text(json.dumps(summary))
        runs.append(str(folder))
    pooled = pooling.pool(pooling.load_runs(runs), None, k=10, resamples=500, against=["control"])
    diff = pooled["paired_differences"]["rule - control"]["recall@10"]
    assert diff[0] == pytest.approx((3 - 2) / 8)  # 3 hits against 2 over the two seeds' 8 new-item users
    everyone = pooled["all_users_recall"]
    # seed 0: 0.25 * 1/4 + 0.75 * 1/2; seed 1: 0.25 * 2/4 + 0.75 * 0; averaged over the seeds
    assert everyone["grown + rule"][0] == pytest.approx((0.0625 + 0.375 + 0.125) / 2)
    assert everyone["control"][0] == pytest.approx(0.25 * 0.25 + 0.75)
    rule_minus = everyone["rule - control"]
    assert rule_minus[0] == pytest.approx(everyone["grown + rule"][0] - everyone["control"][0])
    assert rule_minus[1] <= rule_minus[0] <= rule_minus[2]
    assert "all users, as the population holds them" in pooling.markdown(pooled, 10)
    with pytest.raises(SystemExit, match="--against"):
        pooling.pool(pooling.load_runs(runs), None, k=10, resamples=10, against=["nobody"])
