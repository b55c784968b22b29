"""Pooling demo runs of several seeds: per-user records paired within each run; no model runs."""

from __future__ import annotations

import json

import numpy as np
import pytest


def write_run(root, seed, ranks_by_strategy, nll_by_strategy):
    for name, ranks in ranks_by_strategy.items():
        folder = root / "strategies" / f"{name}-seed{seed}"
        folder.mkdir(parents=True)
        users = [
            {"user": str(u), "rank": r, "constrained_nll": n, "all": True, "cold": False}
            for u, (r, n) in enumerate(zip(ranks, nll_by_strategy[name], strict=True))
        ]
        (folder / "metrics.json").write_text(json.dumps({"users": {"test": users}}))


def test_pooled_differences_pair_users_within_each_run(tmp_path, capsys):
    from benchmarks import pool_demo_runs

    rng = np.random.default_rng(0)
    runs = []
    expected_recall = []
    for seed in (0, 1):
        n = 40 + 10 * seed
        centroid = [int(r) if r < 12 else None for r in rng.integers(0, 30, n)]
        mean = [int(r) if r < 8 else None for r in rng.integers(0, 30, n)]
        nll = {"centroid": rng.normal(7, 1, n).tolist(), "mean": rng.normal(7.3, 1, n).tolist()}
        write_run(tmp_path / f"s{seed}", seed, {"centroid": centroid, "mean": mean}, nll)
        runs.append(str(tmp_path / f"s{seed}"))
        hit = lambda ranks: np.array([r is not None and r < 10 for r in ranks], dtype=float)  # noqa: E731
        expected_recall.append(hit(centroid) - hit(mean))
    pool_demo_runs.main([*runs, "--reference", "mean"])
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| centroid | recall@10 |"))
    difference = float(row.split("|")[4])
    # users pooled over both runs (each run's users weigh as users, not as a seed's mean)
    assert difference == pytest.approx(np.concatenate(expected_recall).mean(), abs=5e-5)
    assert "2 runs, test users: [40, 50]" in out
    with pytest.raises(SystemExit, match="--reference 'gaussian'"):
        pool_demo_runs.main([*runs, "--reference", "gaussian"])
    with pytest.raises(SystemExit, match="holds no finished strategy"):
        pool_demo_runs.main([str(tmp_path / "nowhere")])


def test_a_seed_trained_in_separate_folders_is_one_run(tmp_path, capsys):
    from benchmarks import pool_demo_runs

    rng = np.random.default_rng(1)
    n = 30
    centroid = [int(r) if r < 12 else None for r in rng.integers(0, 30, n)]
    mean = [int(r) if r < 8 else None for r in rng.integers(0, 30, n)]
    nll = {"centroid": rng.normal(7, 1, n).tolist(), "mean": rng.normal(7.3, 1, n).tolist()}
    write_run(tmp_path / "both", 0, {"centroid": centroid, "mean": mean}, nll)
    write_run(tmp_path / "c", 0, {"centroid": centroid}, nll)
    write_run(tmp_path / "m", 0, {"mean": mean}, nll)
    pool_demo_runs.main([str(tmp_path / "both"), "--reference", "mean"])
    together = capsys.readouterr().out
    pool_demo_runs.main([f"{tmp_path / 'c'},{tmp_path / 'm'}", "--reference", "mean"])
    assert capsys.readouterr().out == together
    with pytest.raises(SystemExit, match="'centroid' is in more than one of its folders"):
        pool_demo_runs.main([f"{tmp_path / 'c'},{tmp_path / 'both'}", "--reference", "mean"])


def test_a_peer_is_a_reference_and_the_subset_keeps_warm_or_cold_targets(tmp_path, capsys):
    from benchmarks import pool_demo_runs

    rng = np.random.default_rng(2)
    n = 60
    llm = [int(r) if r < 12 else None for r in rng.integers(0, 30, n)]
    cold = [bool(c) for c in rng.integers(0, 2, n)]
    write_run(tmp_path / "s0", 0, {"centroid": llm}, {"centroid": rng.normal(7, 1, n).tolist()})
    sasrec = [int(r) if r < 15 else None for r in rng.integers(0, 30, n)]
    peer = [
        {"user": str(u), "rank": r, "all": True, "cold": c}
        for u, (r, c) in enumerate(zip(sasrec, cold, strict=True))
    ]
    (tmp_path / "s0" / "peers").mkdir()
    (tmp_path / "s0" / "peers" / "sasrec.json").write_text(json.dumps({"records": peer}))
    metrics = tmp_path / "s0" / "strategies" / "centroid-seed0" / "metrics.json"
    record = json.loads(metrics.read_text())
    for r, c in zip(record["users"]["test"], cold, strict=True):
        r["cold"] = c
    metrics.write_text(json.dumps(record))
    hit = lambda ranks: np.array([r is not None and r < 10 for r in ranks], dtype=float)  # noqa: E731
    for subset, keep in (("all", [True] * n), ("warm", [not c for c in cold]), ("cold", cold)):
        pool_demo_runs.main(
            [str(tmp_path / "s0"), "--peers", "sasrec", "--reference", "sasrec", "--subset", subset]
        )
        out = capsys.readouterr().out
        row = next(line for line in out.splitlines() if line.startswith("| centroid | recall@10 |"))
        expected = (hit(llm) - hit(sasrec))[np.array(keep)].mean()
        assert float(row.split("|")[4]) == pytest.approx(expected, abs=5e-5)
        assert "constrained_nll" not in out  # SASRec has no SID likelihood to pair
        assert f"test users: [{sum(keep)}]" in out
    with pytest.raises(SystemExit, match="no such peer"):
        pool_demo_runs.main([str(tmp_path / "s0"), "--peers", "knn_last"])


def test_an_evaluated_folder_is_a_row_paired_on_the_same_users(tmp_path, capsys):
    """`--evaluated last=FOLDER`: the users.json of `peft-grounded evaluate` (e.g. a checkpoint decoded again)
    is a row like a strategy's, paired per user."""
    from benchmarks import pool_demo_runs

    rng = np.random.default_rng(3)
    n = 50
    best = [int(r) if r < 12 else None for r in rng.integers(0, 30, n)]
    last = [int(r) if r < 16 else None for r in rng.integers(0, 30, n)]
    write_run(tmp_path / "s0", 0, {"centroid": best}, {"centroid": rng.normal(7, 1, n).tolist()})
    users = [
        {"user": str(u), "rank": r, "constrained_nll": 6.5, "all": True, "cold": False}
        for u, r in enumerate(last)
    ]
    (tmp_path / "last").mkdir()
    (tmp_path / "last" / "users.json").write_text(json.dumps({"test": users[::-1]}))  # any order
    pool_demo_runs.main(
        [str(tmp_path / "s0"), "--evaluated", f"last={tmp_path / 'last'}", "--reference", "centroid"]
    )
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| last | recall@10 |"))
    hit = lambda ranks: np.array([r is not None and r < 10 for r in ranks], dtype=float)  # noqa: E731
    assert float(row.split("|")[4]) == pytest.approx((hit(last) - hit(best)).mean(), abs=5e-5)
    with pytest.raises(SystemExit, match="one `peft-grounded evaluate` folder per run"):
        pool_demo_runs.main([str(tmp_path / "s0"), "--evaluated", "last", "--reference", "centroid"])
    with pytest.raises(SystemExit, match="not found"):
        pool_demo_runs.main([str(tmp_path / "s0"), "--evaluated", f"x={tmp_path}", "--reference", "centroid"])
    with pytest.raises(SystemExit, match="already hold a row"):
        pool_demo_runs.main(
            [str(tmp_path / "s0"), "--evaluated", f"centroid={tmp_path / 'last'}", "--reference", "centroid"]
        )


def test_the_subsets_count_and_score_the_same_users(tmp_path, capsys):
    """The runner's records: a seeded sample (``all``) plus the cold-target users outside it (``all`` False).
    ``all`` scores the sample, ``warm`` its non-cold users, ``cold`` every cold-target user, and the printed
    user count is the scored one."""
    from benchmarks import pool_demo_runs

    rng = np.random.default_rng(4)
    n_sample, n_extra = 40, 15
    ranks = [int(r) if r < 12 else None for r in rng.integers(0, 30, n_sample + n_extra)]
    cold = [bool(c) for c in rng.integers(0, 2, n_sample)] + [True] * n_extra
    in_sample = [True] * n_sample + [False] * n_extra
    write_run(tmp_path / "s0", 0, {"centroid": ranks}, {"centroid": [7.0] * len(ranks)})
    metrics = tmp_path / "s0" / "strategies" / "centroid-seed0" / "metrics.json"
    record = json.loads(metrics.read_text())
    for r, c, a in zip(record["users"]["test"], cold, in_sample, strict=True):
        r["cold"], r["all"] = c, a
    metrics.write_text(json.dumps(record))
    peer = [dict(r, rank=None) for r in record["users"]["test"]]  # never a hit
    (tmp_path / "s0" / "peers").mkdir()
    (tmp_path / "s0" / "peers" / "sasrec.json").write_text(json.dumps({"records": peer}))
    hit = np.array([r is not None and r < 10 for r in ranks], dtype=float)
    for subset, keep in (
        ("all", in_sample),
        ("warm", [a and not c for a, c in zip(in_sample, cold, strict=True)]),
        ("cold", cold),
    ):
        pool_demo_runs.main(
            [str(tmp_path / "s0"), "--peers", "sasrec", "--reference", "sasrec", "--subset", subset]
        )
        out = capsys.readouterr().out
        row = next(line for line in out.splitlines() if line.startswith("| centroid | recall@10 |"))
        assert float(row.split("|")[3]) == pytest.approx(hit[np.array(keep)].mean(), abs=5e-5)
        assert f"test users: [{sum(keep)}]" in out
