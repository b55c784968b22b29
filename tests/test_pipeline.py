"""The demo pipeline (smoke preset) and the stage commands, end to end on a tiny model and a toy catalogue."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers.toy_catalogue import toy_catalogue, toy_index

from peft_grounded.cli import main
from peft_grounded.pipeline import run_demo


@pytest.fixture
def model_dir(tmp_path, save_tiny_model):
    return save_tiny_model(tmp_path / "base", tied=False)  # an untied head here


def test_smoke_demo_runs_every_stage_and_resumes(tmp_path, model_dir):
    out = tmp_path / "demo"
    summary = run_demo("smoke", out, model=model_dir, catalogue=toy_catalogue(), diagnostics=False)
    assert set(summary["strategies"]) == {"mean", "centroid_gti"}
    for name in summary["strategies"]:
        metrics = summary["strategies"][name][0]
        assert metrics["test"]["decoding"]["invalid"] == 0
        assert {"all", "cold"} <= set(metrics["test"])
    report = (out / "report.md").read_text()
    assert "| mean |" in report and "| centroid_gti |" in report and "Timings" in report
    reference = summary["popularity_reference"]["test"]["all"]  # the same sampled users as the strategies
    assert reference["users"] == summary["strategies"]["mean"][0]["test"]["all"]["users"]
    assert "| popularity (reference, no model) |" in report
    assert "## Target log-likelihood (test)" in report
    assert set(summary["likelihood"]) == {"mean", "centroid_gti"}
    assert report.startswith("# peft_grounded demo (smoke)\n\n## The answer")  # the report opens with it
    assert "95% interval" in report and "## Learning curves" in report
    # the peers a shop could run, on the same test users, come right after the answer
    assert report.index("## Side by side") < report.index("## Learning curves")
    assert (
        "Every list leaves the user's own history items out." in report
    )  # as recommend serves, and the peers
    labels = {row["label"] for row in summary["side_by_side"]}
    assert {"popularity", "text KNN (last item)", "SASRec", "LLM: mean", "LLM: centroid_gti"} <= labels
    users = {row["all"]["users"] for row in summary["side_by_side"]}
    assert users == {summary["strategies"]["mean"][0]["test"]["all"]["users"]}
    pairs = {(r["strategy"], r["reference"], r["metric"]) for r in summary["intervals"]}
    assert ("centroid_gti", "mean init", "recall@10") in pairs
    assert ("centroid_gti", "popularity (reference, no model)", "constrained_nll") in pairs
    # the answer is written from its intervals: "not established" exactly where an interval holds 0
    for row in summary["intervals"]:
        if row["metric"] in ("recall@10", "constrained_nll"):
            bullet = next(line for line in report.splitlines() if line.startswith(
                f"- **{row['strategy']}** against {row['reference']}:"))  # fmt: skip
            name = "Recall@10" if row["metric"] == "recall@10" else "held-out NLL"
            said = f"{name} not established" if row["holds_zero"] else f"{name} {row['claim']}, "
            assert said in bullet and (row["claim"] == "not established") == row["holds_zero"]
    # the headline: how fast the preset's strategy learns against mean init, the answer's first claim
    lead = summary["headline"]
    assert (lead["strategy"], lead["reference"]) == ("centroid_gti", "mean init")
    assert lead["metric"] == "progressive_nll" and lead["windows"] == 2  # smoke: 2 steps, each a window
    assert report.splitlines()[4] == lead["sentence"]
    assert lead["sentence"].startswith("**Headline: how fast each start learns** (centroid_gti against mean")
    assert ("not established" in lead["sentence"]) == lead["holds_zero"]
    assert f"[{lead['low']:+.3f}, {lead['high']:+.3f}]" in lead["sentence"]
    users = json.loads((out / "strategies" / "mean-seed0" / "metrics.json").read_text())["users"]["test"]
    assert {"user", "target", "rank", "constrained_nll", "all", "cold"} <= set(users[0])
    assert (out / "sids" / "sid_index.json").is_file()
    trained = {p: p.stat().st_mtime_ns for p in out.glob("strategies/*/*/adapter/adapter_model.safetensors")}
    trained = {p: t for p, t in trained.items() if p.parts[-3] in ("grounding", "sft")}
    assert len(trained) == 3  # mean: sft; centroid_gti: grounding and sft
    again = run_demo("smoke", out, model=model_dir, catalogue=toy_catalogue(), diagnostics=False)
    assert again["strategies"] == summary["strategies"]  # finished strategies are reused, not retrained
    assert {p: p.stat().st_mtime_ns for p in trained} == trained  # (equal metrics alone would not show it)


def test_stage_commands(tmp_path, model_dir):
    catalogue = toy_catalogue()
    index = toy_index(catalogue)
    index.save(tmp_path / "sids")
    # the CLI reads catalogues from disk: write the toy catalogue in the LC-Rec JSON format
    items = {
        i: {"title": it.title, "description": it.description, "categories": ", ".join(it.categories)}
        for i, it in catalogue.items.items()
    }
    (tmp_path / "toy.item.json").write_text(json.dumps(items))
    (tmp_path / "toy.inter.json").write_text(json.dumps({u: list(s) for u, s in catalogue.sequences.items()}))
    data = [
        "--model_name_or_path",
        model_dir,
        "--sid_index",
        str(tmp_path / "sids"),
        "--catalogue",
        str(tmp_path / "toy"),
    ]
    tiny = [
        "--max_steps",
        "2",
        "--per_device_train_batch_size",
        "4",
        "--save-steps",
        "2",
        "--max-length",
        "96",
    ]
    assert main(["ground", *data, *tiny, "--init", "centroid", "--output_dir", str(tmp_path / "g")]) == 0
    assert (tmp_path / "g" / "adapter" / "adapter_model.safetensors").is_file()
    assert (
        main(
            [
                "sft",
                *data,
                *tiny,
                "--grounded",
                str(tmp_path / "g" / "adapter"),
                "--lora-r",
                "2",
                "--lora-target-modules",
                "q_proj,v_proj",
                "--output_dir",
                str(tmp_path / "s"),
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "evaluate",
                *data,
                "--adapter",
                str(tmp_path / "s" / "adapter"),
                "--users",
                "4",
                "--ks",
                "1",
                "5",
                "10",
                "--num-beams",
                "10",
                "--output_dir",
                str(tmp_path / "e"),
            ]
        )
        == 0
    )
    metrics = json.loads((tmp_path / "e" / "metrics.json").read_text())
    assert metrics["test"]["all"]["users"] == 4 and metrics["test"]["decoding"]["invalid"] == 0
    # the adapter records its SID index: another index (same catalogue, other seed) is refused, clearly
    other = toy_index(catalogue, seed=1)
    assert other.fingerprint() != index.fingerprint()
    other.save(tmp_path / "other-sids")
    wrong = [
        "--model_name_or_path",
        model_dir,
        "--sid-index",
        str(tmp_path / "other-sids"),
        "--catalogue",
        str(tmp_path / "toy"),
    ]
    assert (
        main(
            [
                "evaluate",
                *wrong,
                "--adapter",
                str(tmp_path / "s" / "adapter"),
                "--output_dir",
                str(tmp_path / "e2"),
            ]
        )
        == 2
    )
    assert not (tmp_path / "e2").exists()


def test_demo_refuses_to_mix_settings_in_one_folder(tmp_path, model_dir):
    from dataclasses import replace

    from peft_grounded.pipeline import PRESETS
    from peft_grounded.training.runs import RunMismatchError

    out = tmp_path / "demo"
    run_demo(
        "smoke", out, model=model_dir, catalogue=toy_catalogue(), strategies=("mean",), diagnostics=False
    )
    with pytest.raises(RunMismatchError, match="codes: 8 -> 4"):
        run_demo(
            replace(PRESETS["smoke"], codes=4),
            out,
            model=model_dir,
            catalogue=toy_catalogue(),
            diagnostics=False,
        )


def test_unknown_preset_names_the_presets(tmp_path):
    with pytest.raises(ValueError, match="unknown demo preset 'x'; choose one of 'default', 'full', 'smoke'"):
        run_demo("x", tmp_path / "demo")
    assert not (tmp_path / "demo").exists()


def test_presets_pass_their_prompt_format_through():
    from dataclasses import replace

    from peft_grounded.pipeline import PRESETS
    from peft_grounded.prompts import PromptFormat

    smoke = PRESETS["smoke"]
    assert smoke.prompt_format().objective == PRESETS["default"].prompt_format().objective == "sequence"
    plain = replace(smoke, fmt=None)
    assert plain.prompt_format() == PromptFormat(max_history=plain.max_history, with_titles=plain.with_titles)
    custom = PromptFormat(max_history=3)
    assert replace(smoke, fmt=custom).prompt_format() is custom


def test_learning_curve_section_from_synthetic_curve_files(tmp_path):
    from peft_grounded.diagnostics.plots import curves_section, read_curve
    from peft_grounded.training.callbacks import learning_curve

    dirs = {}
    for name, slope in (("mean", 0.01), ("centroid", 0.03)):
        dirs[name] = []
        for seed in (0, 1):
            run = tmp_path / "strategies" / f"{name}-seed{seed}"
            run.mkdir(parents=True)
            log = []  # a trainer's log history: loss logs, and validation points every 20 steps
            for s in range(10, 101, 10):
                log.append(
                    {
                        "step": s,
                        "epoch": s / 200,
                        "seconds": 2.0 * s,
                        "items_seen": 8 * s,
                        "loss": 2.0,
                        "item_nll": 9 - slope * s,
                    }
                )
                if s % 20 == 0:
                    log.append(
                        {
                            "step": s,
                            "seconds": 2.0 * s,
                            "valid_nll": 9.0 - slope * s,
                            "valid_constrained_nll": 8.5 - slope * s,
                        }
                    )
            (run / "curve.json").write_text(json.dumps({"sft": learning_curve(log)}))
            dirs[name].append(run)
    dirs["gti"] = [tmp_path / "strategies" / "gti-seed0"]  # no curve written: skipped, not an error
    assert read_curve(dirs["gti"][0]) is None
    curve = read_curve(dirs["centroid"][0])
    assert curve["progressive"][100] == pytest.approx(6.0) and curve["valid"][20] == pytest.approx(7.9)
    lines = curves_section(dirs, tmp_path)
    assert "![learning curves](learning_curves.png)" in lines and "mean over 2 seeds" in lines[2]
    assert (tmp_path / "learning_curves.png").stat().st_size > 1000
    assert "No strategy wrote" in " ".join(curves_section({"gti": dirs["gti"]}, tmp_path / "none"))
    (dirs["gti"][0]).mkdir(parents=True)
    (dirs["gti"][0] / "curve.json").write_text(json.dumps([{"loss": 1}]))
    with pytest.raises(ValueError, match="strategy runner"):
        read_curve(dirs["gti"][0])


def _run(ranks, nlls) -> dict:
    """A strategy runner's record of one seed from per-user ranks (None: not in the list) and target NLLs."""
    users = [
        {"user": f"u{i}", "target": "t", "all": True, "cold": False, "rank": r, "constrained_nll": n}
        for i, (r, n) in enumerate(zip(ranks, nlls, strict=True))
    ]
    hits = sum(r is not None and r < 10 for r in ranks) / len(ranks)
    return {
        "metrics": {"test": {"all": {"recall@10": hits, "ndcg@10": hits / 2}}},
        "likelihood": {"test": {"all": {"constrained_nll": sum(nlls) / len(nlls)}}},
        "users": {"test": users},
    }


def _sentence(lines: list[str], strategy: str, reference: str) -> str:
    return next(line for line in lines if line.startswith(f"- **{strategy}** against {reference}:"))


DIRECTIONS = ("better", "worse", "higher", "lower", "best", "leads", "improve")


def test_the_answer_states_a_direction_only_with_an_interval_above_or_below_0():
    from peft_grounded.pipeline.side_by_side import headline

    n = 200
    records = {  # mean: 8 nats, 50% hits; centroid: 7.5 nats, 75%; gaussian: mean's figures on other users
        "mean": [_run([None, 0] * (n // 2), [9.0, 7.0] * (n // 2))],
        "centroid": [_run([0, 0, 0, None] * (n // 4), [8.5, 6.5] * (n // 2))],
        "gaussian": [_run([0, None] * (n // 2), [7.0, 9.0] * (n // 2))],
    }
    popularity = [
        {"test": [u | {"rank": 30, "constrained_nll": 9.5} for u in records["mean"][0]["users"]["test"]]}
    ]
    lines, rows = headline(records, popularity, (5, 10, 20), resamples=2000)
    assert lines[0] == "## The answer" and f"on the same {n} test users" in lines[2]
    centroid = _sentence(lines, "centroid", "mean init")
    # established: the likelihood leads, with its direction and interval, Recall@10 beside it
    assert centroid.startswith(
        "- **centroid** against mean init: held-out NLL lower, better (-0.500 nats per item, "
    )
    assert "; Recall@10 higher, better (+0.250, 95% interval [+" in centroid
    nll = next(r for r in rows if (r["strategy"], r["reference"], r["metric"]) == ("centroid", "mean init",
                                                                                  "constrained_nll"))  # fmt: skip
    assert nll["claim"] == "lower" and nll["high"] < 0
    assert f"[{nll['low']:+.3f}, {nll['high']:+.3f}]" in centroid
    # not established: said so, with the interval, and no direction
    gaussian = _sentence(lines, "gaussian", "mean init")
    assert gaussian.count("not established") == 2 and "holds 0" in gaussian
    assert not any(word in gaussian for word in DIRECTIONS)
    assert {r["claim"] for r in rows if (r["strategy"], r["reference"]) == ("gaussian", "mean init")} == {
        "not established"
    }
    # against the most-popular ranking: every strategy, from its own intervals
    assert "Recall@10 higher, better" in _sentence(lines, "mean init", "popularity (reference, no model)")
    assert "| not established (interval holds 0) |" in "\n".join(lines)  # the table says it the same way


def test_an_interval_that_holds_0_says_not_established_never_a_direction():
    """The demo's usual case at one seed: the NLL gain is established, Recall@10's interval holds 0."""
    from peft_grounded.pipeline.side_by_side import claim, headline

    n = 100
    hits = [0, None, None, None] * (n // 4)
    records = {
        "mean": [_run(hits, [8.0, 8.2] * (n // 2))],
        "centroid": [_run(hits[1:] + hits[:1], [7.8, 8.0] * (n // 2))],  # the same hit rate, other users
    }
    lines, _ = headline(records, None, (10,), resamples=2000)
    sentence = _sentence(lines, "centroid", "mean init")
    nll, recall = sentence.split("; ")
    assert "held-out NLL lower, better" in nll
    assert recall.startswith("Recall@10 not established (+0.000, 95% interval [-") and recall.endswith(
        "holds 0)."
    )
    assert not any(word in recall for word in DIRECTIONS)
    # the clause alone, at the edge: an interval touching 0 holds it
    edge = {"metric": "recall@10", "difference": 0.01, "low": 0.0, "high": 0.02, "holds_zero": True}
    assert (
        claim(edge, "Recall@10")
        == "Recall@10 not established (+0.010, 95% interval [+0.000, +0.020] holds 0)"
    )
    above = edge | {"low": 0.001, "holds_zero": False}
    assert claim(above, "Recall@10") == "Recall@10 higher, better (+0.010, 95% interval [+0.001, +0.020])"
    worse_nll = {"metric": "constrained_nll", "difference": 0.2, "low": 0.1, "high": 0.3, "holds_zero": False}
    assert claim(worse_nll, "NLL", "nats") == "NLL higher, worse (+0.200 nats, 95% interval [+0.100, +0.300])"


def _curve(folder, item_nlls, items_per_window=40, epoch_per_window=0.01) -> None:
    """A strategy run's curve.json: one logged window per value, every 5 steps."""
    folder.mkdir(parents=True, exist_ok=True)
    train = [
        {"step": 5 * (w + 1), "items_seen": items_per_window * (w + 1), "item_nll": float(v), "loss": v / 4,
         "epoch": epoch_per_window * (w + 1), "progressive": epoch_per_window * (w + 1) <= 1.0}
        for w, v in enumerate(item_nlls)
    ]  # fmt: skip
    (folder / "curve.json").write_text(json.dumps({"sft": {"train": train, "valid": []}}))


def test_the_headline_is_how_fast_a_start_learns_on_the_same_batches(tmp_path):
    """The demo's headline: the paired difference of two runs' progressive NLL (window by window, the same
    batches), established with its direction, or "not established" with no direction."""
    from peft_grounded.pipeline.side_by_side import learning_speed, learning_speed_sentence

    rng = np.random.default_rng(0)
    base = 9.0 - np.linspace(0, 3, 30)  # a falling curve
    _curve(tmp_path / "mean-seed0", base)
    _curve(tmp_path / "gti-seed0", base - 0.5 + rng.normal(0, 0.05, 30))  # 0.5 nats faster, every window
    _curve(tmp_path / "gauss-seed0", base + rng.normal(0, 0.3, 30))  # level, noisy
    dirs = {name: [tmp_path / f"{name}-seed0"] for name in ("mean", "gti", "gauss")}
    row = learning_speed(dirs, "gti")
    assert row["difference"] == pytest.approx(-0.5, abs=0.03) and row["high"] < 0 and row["claim"] == "lower"
    assert (row["windows"], row["steps"], row["seeds"], row["reference"]) == (30, 150, 1, "mean init")
    sentence = learning_speed_sentence(row)
    assert sentence.startswith("**Headline: how fast each start learns** (gti against mean init; ")
    assert "30 logged windows of its first 150 SFT steps" in sentence
    assert sentence.endswith(
        f"progressive NLL lower, better ({row['difference']:+.3f} nats per item, 95% interval "
        f"[{row['low']:+.3f}, {row['high']:+.3f}])."
    )
    level = learning_speed(dirs, "gauss")
    assert level["holds_zero"] and level["claim"] == "not established"
    said = learning_speed_sentence(level)
    assert "progressive NLL not established" in said and "holds 0" in said
    assert not any(word in said.split("):", 1)[1] for word in DIRECTIONS)
    # two seeds pool, resampled within each
    _curve(tmp_path / "mean-seed1", base)
    _curve(tmp_path / "gti-seed1", base - 0.3)
    pooled = {n: [tmp_path / f"{n}-seed0", tmp_path / f"{n}-seed1"] for n in ("mean", "gti")}
    row = learning_speed(pooled, "gti")
    assert row["seeds"] == 2 and row["difference"] == pytest.approx(-0.4, abs=0.03)
    assert "30 logged windows of its first 150 SFT steps x 2 seeds" in learning_speed_sentence(row)


def test_the_headline_refuses_runs_it_cannot_pair(tmp_path):
    from peft_grounded.pipeline.side_by_side import learning_speed

    _curve(tmp_path / "mean-seed0", [8.0, 7.0, 6.0])
    _curve(tmp_path / "gti-seed0", [7.0, 6.0, 5.0], items_per_window=41)  # other batches
    dirs = {name: [tmp_path / f"{name}-seed0"] for name in ("mean", "gti")}
    with pytest.raises(ValueError, match=r"trained on other batches .* cannot be paired"):
        learning_speed(dirs, "gti")
    # past the first epoch a window's targets were trained on: not a progressive window, so no headline
    _curve(tmp_path / "mean-seed0", [8.0, 7.0, 6.0], epoch_per_window=2.0)
    _curve(tmp_path / "gti-seed0", [7.0, 6.0, 5.0], epoch_per_window=2.0)
    assert learning_speed(dirs, "gti") is None
    assert learning_speed({"mean": [tmp_path / "none"], "gti": [tmp_path / "none2"]}, "gti") is None


def test_the_answer_without_intervals_claims_nothing():
    from peft_grounded.pipeline.side_by_side import headline

    records = {
        "mean": [_run([None] * 40, [8.0] * 40)],
        "centroid": [_run([0] * 20 + [None] * 20, [7.0] * 40)],
    }
    # runs recorded before per-user results: said, and no claim made
    old = {name: [{k: v for k, v in recs[0].items() if k != "users"}] for name, recs in records.items()}
    lines, rows = headline(old, None, (10,))
    assert rows == [] and "No per-user results" in lines[-2] and "no claim" in lines[-2]
    assert not any(word in " ".join(lines) for word in DIRECTIONS)
    # no reference run: nothing to pair with
    lines, rows = headline({"centroid": records["centroid"]}, None, (10,))
    assert rows == [] and "no interval, so no claim" in " ".join(lines)
    # nobody hit a target: said as a fact, every Recall claim not established
    empty = {name: [_run([None] * 40, [n] * 40)] for name, n in (("mean", 8.0), ("centroid", 7.5))}
    lines, _ = headline(empty, None, (10,), resamples=200)
    assert "No strategy ranks a test target in its top 10" in lines[2]
    assert "Recall@10 not established" in _sentence(lines, "centroid", "mean init")
    # a run that decoded the validation users only opens with them (it raised KeyError 'test' before)
    valid = {
        name: [{section: {"valid": r[section]["test"]} for section, r in ((k, recs[0]) for k in recs[0])}]
        for name, recs in records.items()
    }
    lines, rows = headline(valid, None, (5, 10, 20), part="valid", resamples=200)
    assert "on the same 40 valid users" in lines[2] and rows
    assert "Recall@10 higher, better" in _sentence(lines, "centroid", "mean init")


def test_demo_diagnostics_import_error_is_explained(tmp_path, monkeypatch):
    import sys

    from peft_grounded.pipeline.demo import _diagnostics

    monkeypatch.setitem(sys.modules, "peft_grounded.diagnostics", None)  # makes the import fail
    text = _diagnostics(tmp_path, None, None, None, "model")
    assert "Skipped: the diagnostics could not be imported" in text and "peft_grounded.diagnostics" in text


def test_the_headline_of_a_damaged_curve_says_what_to_fix(tmp_path):
    """A curve.json that is not the runner's gives an error naming the file, and the demo reports no headline
    with that reason instead of stopping after its runs trained."""
    from peft_grounded.pipeline.demo import PRESETS, _headline
    from peft_grounded.pipeline.side_by_side import learning_speed

    _curve(tmp_path / "mean-seed0", [8.0, 7.0, 6.0])
    (tmp_path / "centroid_gti-seed0").mkdir()
    (tmp_path / "centroid_gti-seed0" / "curve.json").write_text('{"sft": [1, 2]}')
    dirs = {name: [tmp_path / f"{name}-seed0"] for name in ("mean", "centroid_gti")}
    with pytest.raises(ValueError, match=r"curve\.json: expected .* as the strategy runner writes it"):
        learning_speed(dirs, "centroid_gti")
    lead = _headline(PRESETS["default"], dirs)
    assert lead["claim"] is None and lead["sentence"].startswith("**No headline**: ")
    assert "strategy runner writes it" in lead["sentence"]
    (tmp_path / "centroid_gti-seed0" / "curve.json").write_text("{not json")
    assert "No headline" in _headline(PRESETS["default"], dirs)["sentence"]
