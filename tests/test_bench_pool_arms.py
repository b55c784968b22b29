"""Arms paired per user against a reference arm: strategy runs, evaluate outputs and a peer's file."""

from __future__ import annotations

import json

import numpy as np
import pytest


def records(ranks, nll=None):
    out = []
    for u, r in enumerate(ranks):
        record = {"user": str(u), "target": str(100 + u), "all": True, "cold": False, "rank": r}
        if nll is not None:
            record["constrained_nll"] = nll[u]
        out.append(record)
    return out


def hits(ranks):
    return np.array([r is not None and r < 10 for r in ranks], dtype=float)


def test_a_peer_file_pairs_with_an_evaluate_output_on_recall_and_ndcg(tmp_path, capsys):
    from benchmarks import pool_arms

    rng = np.random.default_rng(0)
    llm = [int(r) if r < 15 else None for r in rng.integers(0, 40, 60)]
    peer = [int(r) if r < 15 else None for r in rng.integers(0, 30, 60)]
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "users.json").write_text(
        json.dumps({"test": records(llm, rng.normal(6, 1, 60).tolist())})
    )
    peer_file = tmp_path / "sasrec.json"
    peer_file.write_text(json.dumps({"records": records(peer), "minutes": 1.5, "best_epoch": 7}))
    pool_arms.main(["--part", "test", f"sasrec={peer_file}", f"llm={tmp_path / 'eval'}"])
    out = capsys.readouterr().out
    assert "constrained_nll" not in out  # the peer holds no likelihood
    row = next(line for line in out.splitlines() if line.startswith("| llm |"))
    cells = [c.strip() for c in row.split("|")]
    assert float(cells[3]) == pytest.approx(hits(llm).mean(), abs=5e-5)
    assert float(cells[5].split()[0]) == pytest.approx((hits(llm) - hits(peer)).mean(), abs=5e-5)
    assert "best epoch 7, 90 s" in out
    with pytest.raises(SystemExit, match="--part test"):
        pool_arms.main(["--part", "valid", f"sasrec={peer_file}", f"llm={tmp_path / 'eval'}"])


def test_arms_scored_on_other_users_are_refused(tmp_path):
    from benchmarks import pool_arms

    for name, n in (("a", 30), ("b", 31)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "users.json").write_text(json.dumps({"valid": records([1] * n, [5.0] * n)}))
    with pytest.raises(ValueError, match="different users"):
        pool_arms.main([f"a={tmp_path / 'a'}", f"b={tmp_path / 'b'}"])


def test_a_subset_keeps_the_warm_or_the_cold_target_users(tmp_path, capsys):
    from benchmarks import pool_arms

    ranks_a, ranks_b = [0, None, 3, None, 1, 2], [None, None, 3, 0, None, 2]
    for name, ranks in (("a", ranks_a), ("b", ranks_b)):
        rows = records(ranks, [5.0] * 6)
        for r in rows[:2]:
            r["cold"] = True  # users 0 and 1 have a cold target
        rows[1]["all"] = False  # a cold-target user outside the seeded sample
        (tmp_path / name).mkdir()
        (tmp_path / name / "users.json").write_text(json.dumps({"valid": rows}))
    for subset, users in (("all", [0, 2, 3, 4, 5]), ("warm", [2, 3, 4, 5]), ("cold", [0, 1])):
        pool_arms.main(["--subset", subset, f"a={tmp_path / 'a'}", f"b={tmp_path / 'b'}"])
        out = capsys.readouterr().out
        assert f"{subset} users ({len(users)} user-seeds)" in out
        row = next(line for line in out.splitlines() if line.startswith("| b |"))
        diff = hits([ranks_b[u] for u in users]) - hits([ranks_a[u] for u in users])
        assert float(row.split("|")[6].split()[0]) == pytest.approx(diff.mean(), abs=5e-5)


def test_pooled_seeds_show_each_seed_s_difference(tmp_path, capsys):
    from benchmarks import pool_arms

    ranks = {  # b gains 2 users of 6 at seed 0 and loses 2 at seed 1: level pooled
        ("a", 0): [0, 1, None, None, 5, None],
        ("b", 0): [0, 1, 2, 3, 5, None],
        ("a", 1): [0, 1, 2, 3, None, None],
        ("b", 1): [0, 1, None, None, None, None],
    }
    for (name, seed), r in ranks.items():
        (tmp_path / f"{name}{seed}").mkdir()
        (tmp_path / f"{name}{seed}" / "users.json").write_text(json.dumps({"valid": records(r, [5.0] * 6)}))
    pool_arms.main([f"a={tmp_path / 'a0'},{tmp_path / 'a1'}", f"b={tmp_path / 'b0'},{tmp_path / 'b1'}"])
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| b |"))
    cells = [c.strip() for c in row.split("|")]
    assert float(cells[6].split()[0]) == pytest.approx(0.0, abs=5e-5)
    assert cells[-2] == "+0.3333 / -0.3333"
    with pytest.raises(SystemExit, match="no user is in both"):
        pool_arms.seed_differences([records([1])], [[{**records([1])[0], "user": "other"}]], "recall@10")


def test_repeat_pairs_add_the_training_spread_to_every_interval(tmp_path, capsys):
    from benchmarks import pool_arms

    rng = np.random.default_rng(1)
    n = 200

    def write(name, ranks):
        (tmp_path / name).mkdir()
        (tmp_path / name / "users.json").write_text(json.dumps({"valid": records(ranks, [5.0] * n)}))

    base = [int(r) if r < 12 else None for r in rng.integers(0, 40, n)]
    write("a", base)
    write("b", [0 if i < 10 else r for i, r in enumerate(base)])  # b gains 10 of 200 users: +0.05
    rerun = list(base)
    for i in range(20, 26):  # a rerun of a's recipe: 6 users hit instead of missed, 0.03 apart
        rerun[i] = 0 if rerun[i] is None or rerun[i] >= 10 else None
    write("a_rerun", rerun)
    gap = (hits(rerun) - hits(base)).mean()
    arms = [f"a={tmp_path / 'a'}", f"b={tmp_path / 'b'}"]

    def row_b(*extra):
        pool_arms.main([*arms, *extra])  # --repeats takes every value after it
        out = capsys.readouterr().out
        row = next(line for line in out.splitlines() if line.startswith("| b |"))
        low, high = (float(x) for x in row.split("|")[6].split("[")[1].rstrip(" ]").split(", "))
        return out, high - low

    plain, narrow = row_b()
    carried, wide = row_b("--repeats", f"{tmp_path / 'a'}:{tmp_path / 'a_rerun'}")
    assert "plus one training run's spread" not in plain
    sd = abs(gap) / np.sqrt(2)
    assert f"recall@10 {sd:.4f}" in carried and "1 repeat pairs" in carried
    assert wide > narrow
    with pytest.raises(SystemExit, match="DIR_A:DIR_B"):
        pool_arms.main([*arms, "--repeats", str(tmp_path / "a")])
