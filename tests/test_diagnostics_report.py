"""The diagnostics report: snapshots, bad input, and the files it writes."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch

from peft_grounded.diagnostics import GeometrySnapshot, ReportConfig, measure_snapshots, write_report
from peft_grounded.sids.index import sid_vocabulary

LEVELS = [8, 8, 8]
WIDTH = 16
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def make_world(seed: int = 0) -> dict:
    """A vocabulary, a SID index of 3 x 8 tokens with centroids, categories and code frequencies."""
    rng = np.random.default_rng(seed)
    vocab = torch.tensor(rng.normal(size=(120, WIDTH)), dtype=torch.float32)
    vocab_tokens = [f"tok{i}" for i in range(119)] + ["a|b`c\n"]  # awkward strings must render
    tokens = sid_vocabulary(LEVELS)
    n = len(tokens)
    reference = rng.normal(size=(n, 24))  # centroids, wider than the model
    centres = 3.0 * rng.normal(size=(3, 24))
    reference[: LEVELS[0]] += centres[np.arange(LEVELS[0]) % 3]  # level-0 centroids cluster by category
    categories = [f"cat{code % 3}" for code in range(LEVELS[0])] + [None] * (n - LEVELS[0])  # level 0 only
    frequencies = rng.zipf(1.8, size=n).clip(max=200).astype(float)
    mean = vocab.mean(0)
    axis = rng.normal(size=WIDTH)
    rows = {
        "mean": mean.repeat(n, 1),
        "centroid": torch.tensor(reference[:, :WIDTH], dtype=torch.float32) + mean,
        "sft": torch.tensor(
            np.outer(frequencies, axis) + 0.05 * rng.normal(size=(n, WIDTH)), dtype=torch.float32
        ),
    }
    return dict(
        vocab=vocab,
        vocab_tokens=vocab_tokens,
        tokens=tokens,
        reference=reference,
        categories=categories,
        frequencies=frequencies,
        rows=rows,
    )


@pytest.fixture(scope="module")
def world():
    return make_world()


def snapshot(world, name, stage="init", rows=None, **overrides):
    fields = dict(
        name=name,
        stage=stage,
        sid_rows=world["rows"][name] if rows is None else rows,
        sid_tokens=world["tokens"],
        vocab_rows=world["vocab"],
        vocab_tokens=world["vocab_tokens"],
        reference=world["reference"],
        categories=world["categories"],
        frequencies=world["frequencies"],
        exclude_vocab_ids=[0],
    )
    fields.update(overrides)
    return GeometrySnapshot(**fields)


def assert_png(path):
    import matplotlib.image

    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 50 and image.shape[1] > 50


def test_full_report_compares_checkpoints(world, tmp_path):
    snaps = [snapshot(world, "mean"), snapshot(world, "centroid"), snapshot(world, "sft", stage="sft")]
    files = write_report(tmp_path / "out", snaps, ReportConfig(html=True, n_text=10, purity_m=2))

    assert set(files.figures) == {"heatmaps", "spectra", "ranks", "rsa", "purity", "r2"}
    for path in files.figures.values():
        assert_png(path)
    assert not files.skipped
    markdown = files.markdown.read_text()
    for name in files.figures:
        assert f"figures/{name}.png" in markdown
    assert "only 24 exist" in markdown  # the heatmap asked for 50 SID tokens of 24: clamped, said
    assert "`<a_0>`" in markdown and "a\\|b" not in markdown.split("Nearest")[0]
    assert "Skipped" not in markdown
    assert "<html>" in files.html.read_text() and "&lt;a_0&gt;" in files.html.read_text()
    assert not list(tmp_path.rglob("*.tmp"))

    written = json.loads(files.metrics_json.read_text())
    assert len(written["heatmap"]["text_ids"]) == 10 and 0 not in written["heatmap"]["text_ids"]  # excluded
    metrics = {m["name"]: m for m in written["snapshots"]}
    assert metrics["mean"]["effective_rank"] == pytest.approx(1.0)
    assert metrics["mean"]["effective_rank_centred"] == 0.0
    assert metrics["mean"]["rsa"]["pearson"] is None  # undefined for identical rows, written as null
    assert metrics["centroid"]["rsa"]["pearson"] > 0.5  # truncated, shifted centroids keep the geometry
    assert metrics["sft"]["popularity_r2"][0]["r2"] > 0.95
    assert metrics["centroid"]["popularity_r2"][2]["r2"] < metrics["sft"]["popularity_r2"][2]["r2"]
    assert set(metrics["centroid"]["rsa_by_level"]) == {"a", "b", "c"}
    assert metrics["mean"]["purity"]["value"] == pytest.approx(metrics["mean"]["purity"]["chance"])
    sizes = Counter(c for c in world["categories"] if c is not None)
    best = np.mean([min(2, sizes[c] - 1) / 2 for c in world["categories"] if c is not None])  # P_2 ceiling
    assert metrics["centroid"]["purity"]["value"] == pytest.approx(best)  # clustered centroids: perfect
    assert metrics["sft"]["purity_reference"]["value"] == pytest.approx(best)
    assert best > 0.8 > metrics["mean"]["purity"]["chance"]

    nearest = json.loads(files.nearest_json.read_text())
    assert set(nearest) == {"mean", "centroid", "sft"} and len(nearest["sft"]) == 24
    assert all(label != "tok0" for entries in nearest["sft"].values() for label, _ in entries)  # excluded


def test_missing_inputs_skip_their_figures_and_say_so(world, tmp_path):
    snaps = [
        snapshot(
            world,
            "mean",
            categories=None,
            reference=None,
            frequencies=None,
            vocab_rows=None,
            vocab_tokens=None,
            exclude_vocab_ids=None,
        ),
        snapshot(world, "sft", categories=None, reference=None, frequencies=None),
    ]
    files = write_report(tmp_path, snaps, ReportConfig(n_sid=6, n_text=4))
    assert set(files.figures) == {"heatmaps", "spectra", "ranks"}
    markdown = files.markdown.read_text()
    assert "Skipped: Neighbourhood purity: the catalogue gives no categories" in markdown
    assert "Skipped: RSA" in markdown and "Skipped: Popularity R^2" in markdown
    assert "mean: no vocabulary rows: its heatmap shows SID tokens only" in markdown
    assert len(files.skipped) == 4  # RSA, purity, popularity, semantic; nearest tokens exist for "sft"
    assert_png(files.figures["heatmaps"])
    assert not (tmp_path / "figures" / "purity.png").exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda w: {"sid_tokens": w["tokens"][:-1]}, "24 SID rows but 23 SID token strings"),
        (lambda w: {"reference": w["reference"][:-2]}, "one codebook or centroid vector per SID token"),
        (lambda w: {"vocab_rows": w["vocab"][:, :8]}, "same model's input-embedding rows"),
        (lambda w: {"vocab_tokens": w["vocab_tokens"][:5]}, "decode every vocabulary row"),
        (lambda w: {"frequencies": w["frequencies"][:3]}, "frequencies has 3 entries"),
        (lambda w: {"sid_rows": w["rows"]["sft"][0]}, r"\(tokens x width\) matrix"),
    ],
)
def test_snapshots_reject_fields_that_do_not_match(world, change, message):
    with pytest.raises(ValueError, match=message):
        snapshot(world, "sft", **change(world))


def test_report_refuses_snapshots_from_different_indexes_before_writing(world, tmp_path):
    other_tokens = sid_vocabulary([8, 8, 7])
    smaller = snapshot(
        world,
        "sft",
        rows=world["rows"]["sft"][:23],
        sid_tokens=other_tokens,
        reference=None,
        categories=None,
        frequencies=None,
    )
    with pytest.raises(ValueError, match="same SID index"):
        write_report(tmp_path / "a", [snapshot(world, "mean"), smaller])
    reordered = snapshot(world, "sft", sid_tokens=world["tokens"][::-1])
    with pytest.raises(ValueError, match="another order"):
        write_report(tmp_path / "b", [snapshot(world, "mean"), reordered])
    with pytest.raises(ValueError, match="unique"):
        write_report(tmp_path / "c", [snapshot(world, "mean"), snapshot(world, "mean")])
    assert not any(tmp_path.iterdir())


def test_too_few_tokens_raise_when_strict_and_small_m_is_clamped(world):
    with pytest.raises(ValueError, match="only 24 exist"):
        measure_snapshots([snapshot(world, "sft")], ReportConfig(strict=True))
    _, (metrics,) = measure_snapshots([snapshot(world, "sft")], ReportConfig(n_sid=24, purity_m=50))
    labelled = sum(c is not None for c in world["categories"])
    assert metrics.purity.m == labelled - 1
    assert any("instead of 50" in note for note in metrics.notes)
