"""Split/cold-item evaluation, the markdown and JSON writers, and evaluation through real decoding."""

from __future__ import annotations

import json
import math

import pytest
from helpers.decoding_fixtures import add_sid_tokens, chat_prompts, make_catalogue

from peft_grounded.decoding import recommend
from peft_grounded.evaluation import (
    comparison_table,
    evaluate_predictions,
    evaluate_split,
    markdown_table,
    write_json,
    write_markdown,
)

KS = (1, 2)


def test_cold_subset_keeps_only_users_with_a_cold_target():
    predictions = [["a", "b"], ["c", "a"], ["b", "c"], ["a", "c"]]
    targets = ["a", "a", "d", "c"]
    result = evaluate_split(predictions, targets, cold_items={"c", "d"}, ks=KS)
    assert result["all"]["users"] == 4
    assert result["all"]["recall@1"] == pytest.approx(1 / 4) and result["all"]["recall@2"] == pytest.approx(
        3 / 4
    )
    assert result["cold"]["users"] == 2  # users 2 (target d, missed) and 3 (target c at rank 1)
    assert result["cold"]["recall@1"] == 0.0 and result["cold"]["recall@2"] == pytest.approx(1 / 2)
    assert result["cold"]["ndcg@2"] == pytest.approx(1 / math.log2(3) / 2)
    assert "cold" not in evaluate_split(predictions, targets, ks=KS)
    assert evaluate_split(predictions, targets, cold_items=set(), ks=KS)["cold"]["recall@1"] is None


def test_tables_and_atomic_files(tmp_path):
    splits = {"valid": ([["a", "b"], ["b", "a"]], ["a", "a"]), "test": ([["a", "b"], ["b", "a"]], ["b", "c"])}
    results = evaluate_predictions(splits, cold_items={"c"}, ks=KS)
    table = markdown_table(results, title="run")
    lines = table.strip().splitlines()
    assert lines[0] == "### run"
    assert lines[2] == "| split | targets | users | R@1 | R@2 | N@1 | N@2 |"
    assert lines[4] == "| valid | all | 2 | 0.5000 | 1.0000 | 0.5000 | 0.8155 |"
    assert lines[-1] == "| test | cold | 1 | 0.0000 | 0.0000 | 0.0000 | 0.0000 |"
    assert len(lines) == 4 + 4

    empty_cold = evaluate_predictions({"valid": splits["valid"]}, cold_items={"zzz"}, ks=KS)
    assert "| valid | cold | 0 | – | – | – | – |" in markdown_table(empty_cold)

    compare = comparison_table({"mean": results, "gti": results}, split="test", subset="all")
    row = "| 2 | 0.0000 | 0.5000 | 0.0000 | 0.3155 |"
    assert compare.splitlines()[2:] == [f"| mean {row}", f"| gti {row}"]
    with pytest.raises(ValueError, match="no 'test'/'cold'"):
        comparison_table({"mean": {"test": {"all": results["test"]["all"]}}}, subset="cold")

    path = tmp_path / "out" / "results.json"
    write_json(path, results)
    assert json.loads(path.read_text()) == results
    write_markdown(tmp_path / "out" / "results.md", results)
    assert (tmp_path / "out" / "results.md").read_text() == markdown_table(results)
    # A failed write leaves the previous file untouched and no temp file behind.
    with pytest.raises(ValueError):
        write_json(path, {"bad": float("nan")})
    assert json.loads(path.read_text()) == results
    assert sorted(p.name for p in path.parent.iterdir()) == ["results.json", "results.md"]


def test_evaluation_through_constrained_decoding(tokenizer, tiny_model_factory):
    model = tiny_model_factory(arch="llama", tied=True)
    add_sid_tokens(tokenizer, model)
    catalogue = make_catalogue(tokenizer)
    prompts = chat_prompts(tokenizer)
    ks = (1, 5, 10, 20)
    ranked = recommend(model, tokenizer, prompts, catalogue, k=20).items
    missed = next(item for item in catalogue if item not in ranked[2])
    targets = [ranked[0][0], ranked[1][3], missed]  # ranks 0, 3 and outside the top 20
    decoded = recommend(model, tokenizer, prompts, catalogue, k=max(ks), num_beams=max(ks))
    results = {"valid": evaluate_split(decoded.items, targets, {targets[1]}, ks, items=catalogue)}
    results["valid"]["decoding"] = decoded.stats()
    valid = results["valid"]
    assert valid["all"]["recall@1"] == pytest.approx(1 / 3)
    assert valid["all"]["recall@5"] == pytest.approx(2 / 3) == valid["all"]["recall@20"]
    assert valid["all"]["ndcg@5"] == pytest.approx((1 + 1 / math.log2(5)) / 3)
    assert valid["cold"] == {**valid["cold"], "users": 1, "recall@1": 0.0, "recall@5": 1.0}
    assert valid["decoding"]["invalid"] == 0 and valid["decoding"]["num_beams"] == 20
    json.dumps(results, allow_nan=False)
    with pytest.raises(ValueError, match="not in the catalogue"):
        evaluate_split(decoded.items, ["nope", *targets[1:]], ks=ks, items=catalogue)


def test_every_atomic_writer_gives_ordinary_permissions(tmp_path):
    """Reports, metrics and manifests are as readable as any file the user writes (not mkstemp's 0600)."""
    import os
    from pathlib import Path

    from peft_grounded._io import atomic_write, atomic_write_text
    from peft_grounded.training import runs

    mask = os.umask(0)
    os.umask(mask)
    runs.write_json_atomic(tmp_path / "run.json", {"a": 1})
    write_json(tmp_path / "metrics.json", {"valid": {}})
    atomic_write_text(tmp_path / "report.md", "x")
    atomic_write(tmp_path / "plot.png", b"x")
    atomic_write(Path(tmp_path / "index.json"), b"x")
    for name in ("run.json", "metrics.json", "report.md", "plot.png", "index.json"):
        assert os.stat(tmp_path / name).st_mode & 0o777 == 0o666 & ~mask, name

    class Saver:  # what save_adapter_atomic needs of a PeftModel
        def save_pretrained(self, directory):
            (Path(directory) / "adapter_config.json").write_text("{}")

    from peft_grounded.training.runs import save_adapter_atomic

    save_adapter_atomic(Saver(), tmp_path / "stage" / "adapter")
    assert os.stat(tmp_path / "stage" / "adapter").st_mode & 0o777 == 0o777 & ~mask
    assert not [p for p in tmp_path.rglob(".*")]  # no temporary file or folder left


def test_popularity_reference_ranks_training_targets_on_the_sampled_users():
    from peft_grounded.evaluation import EvalSettings, evaluate_popularity
    from peft_grounded.sids.catalogue import LeaveOneOut

    split = LeaveOneOut.from_sequences(
        {
            "u1": ("x", "a", "b", "a", "c"),  # training targets a, b; valid a; test c
            "u2": ("y", "a", "c", "b", "d"),  # a, c; valid b; test d
            "u3": ("z", "b", "a", "c", "a"),  # b, a; valid c; test a
            "u4": ("w", "a", "e", "d", "e"),  # a, e; valid d; test e
        }
    )
    result = evaluate_popularity(split, settings=EvalSettings(ks=KS))  # top-2: a (4 times), b (2)
    assert result["test"]["all"]["recall@1"] == pytest.approx(1 / 4)  # only u3's target a
    assert result["valid"]["all"]["recall@2"] == pytest.approx(2 / 4)  # u1's a and u2's b
    assert result["valid"]["all"]["ndcg@2"] == pytest.approx((1 + 1 / math.log2(3)) / 4)
    cold = result["test"]["cold"]  # c, d, e were targets at most once: never in the top-2
    assert cold["users"] == 3 and cold["cold_users_available"] == 3 and cold["recall@2"] == 0.0
    assert evaluate_popularity(split, settings=EvalSettings(ks=KS, users=2))["test"]["all"]["users"] == 2
    with pytest.raises(ValueError, match="fewer than K=20"):
        evaluate_popularity(split, settings=EvalSettings())
    # the likelihood reference: add-one-smoothed target frequencies over the 9 catalogue items (8 targets)
    scored = evaluate_popularity(split, settings=EvalSettings(ks=KS), items=list("abcdewxyz"))["test"]
    expected = -(math.log(2 / 17) + math.log(1 / 17) + math.log(5 / 17) + math.log(2 / 17)) / 4  # c, d, a, e
    assert scored["all"]["constrained_nll"] == pytest.approx(expected)
    assert "constrained_nll" not in result["test"]["all"]  # only with the items
    with pytest.raises(ValueError, match="not among the given items"):
        evaluate_popularity(split, settings=EvalSettings(ks=KS), items=["a", "b"])
