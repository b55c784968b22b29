"""The package's figures, as PNGs (matplotlib's Agg canvas; no pyplot, no global state): the diagnostics
report's heatmaps, curves and bars, and the learning curves of a strategy comparison.

Each function takes plain data, writes one PNG atomically and returns its path.
"""

from __future__ import annotations

import io
import math
import os
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from peft_grounded._imports import require

from .._io import read_json
from ..training.runs import CURVE_FILE

require("matplotlib", "the diagnostics figures (diagnose)")
from matplotlib import colormaps  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from peft_grounded._io import atomic_write  # noqa: E402

DPI = 110


def _save(fig: Figure, path: str | os.PathLike[str]) -> Path:
    FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight")
    return atomic_write(path, buffer.getvalue())


def _blocks(groups: Sequence[str]) -> list[tuple[str, int, int]]:
    """Runs of equal labels as (label, start, stop)."""
    runs: list[tuple[str, int, int]] = []
    for index, group in enumerate(groups):
        if runs and runs[-1][0] == group:
            runs[-1] = (group, runs[-1][1], index + 1)
        else:
            runs.append((group, index, index + 1))
    return runs


def plot_heatmaps(
    path: str | os.PathLike[str],
    matrices: Sequence[np.ndarray],
    titles: Sequence[str],
    groups: Sequence[str],
    ncols: int = 4,
) -> Path:
    """Cosine-similarity heatmaps side by side, on one [-1, 1] scale, with lines between token blocks.

    ``groups`` labels each row/column (e.g. "text", then the SID level letters) and is shared by all
    matrices.
    """
    ncols = max(1, min(ncols, len(matrices)))
    nrows = math.ceil(len(matrices) / ncols)
    fig = Figure(figsize=(3.6 * ncols + 0.8, 3.4 * nrows))
    axes = fig.subplots(nrows, ncols, squeeze=False)
    image = None
    runs = _blocks(groups)
    cmap = colormaps["RdBu_r"].with_extremes(bad="#d9d9d9")  # grey: no rows (a snapshot without vocabulary)
    for ax, matrix, title in zip(axes.flat, matrices, titles, strict=False):
        image = ax.imshow(matrix, cmap=cmap, vmin=-1.0, vmax=1.0, interpolation="nearest")
        for _, start, _stop in runs[1:]:
            ax.axhline(start - 0.5, color="black", linewidth=0.6)
            ax.axvline(start - 0.5, color="black", linewidth=0.6)
        centres = [(start + stop - 1) / 2 for _, start, stop in runs]
        ax.set_xticks(centres, [label for label, _, _ in runs], fontsize=7)
        ax.set_yticks(centres, [label for label, _, _ in runs], fontsize=7)
        ax.set_title(title, fontsize=9)
    for ax in list(axes.flat)[len(matrices) :]:
        ax.axis("off")
    if image is not None:
        fig.colorbar(image, ax=list(axes.flat), shrink=0.8, label="cosine similarity")
    return _save(fig, path)


def plot_curves(
    path: str | os.PathLike[str],
    panels: Mapping[str, Mapping[str, Sequence[float]]],
    xlabel: str,
    ylabel: str,
    logy: bool = False,
    ylim: tuple[float, float] | None = None,
) -> Path:
    """Line charts, one panel per entry of ``panels`` ({panel title: {series name: y values}}), x = 1..n.

    Used for overlaid singular-value spectra (``logy=True``; zeros are not drawn) and R^2_q curves.
    """
    fig = Figure(figsize=(4.6 * len(panels), 3.4))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (title, series) in zip(axes, panels.items(), strict=True):
        for name, values in series.items():
            y = np.asarray(values, dtype=np.float64)
            if logy:
                if not (y > 0).any():
                    name += " (all zero)"
                y = np.where(y > 0, y, np.nan)
            # markers, so that a single non-zero value (a rank-one spectrum) still shows
            size = 3 if y.size <= 20 else 1.5
            ax.plot(np.arange(1, y.size + 1), y, marker="o", markersize=size, label=name)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if logy:
            ax.set_yscale("log")
        if ylim is not None:
            ax.set_ylim(*ylim)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, path)


def plot_bars(
    path: str | os.PathLike[str],
    names: Sequence[str],
    series: Mapping[str, Sequence[float]],
    title: str,
    ylabel: str,
    reference_lines: Mapping[str, float] | None = None,
    ylim: tuple[float, float] | None = None,
) -> Path:
    """Grouped bars: one group per snapshot (``names``), one bar per entry of ``series``.

    Missing values (NaN) are marked "n/a"; ``reference_lines`` draws labelled horizontal lines
    (e.g. a chance level).
    """
    fig = Figure(figsize=(max(4.0, 1.0 + 0.9 * len(names) * max(1, len(series)) / 2), 3.6))
    ax = fig.subplots()
    x = np.arange(len(names))
    width = 0.8 / max(1, len(series))
    for index, (label, values) in enumerate(series.items()):
        y = np.asarray(values, dtype=np.float64)
        offsets = x - 0.4 + width * (index + 0.5)
        bars = ax.bar(offsets, np.nan_to_num(y, nan=0.0), width, label=label)
        for bar, value in zip(bars, y, strict=True):
            text = "n/a" if np.isnan(value) else f"{value:.2f}"
            ax.annotate(
                text,
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=6,
            )
    for (label, value), style in zip((reference_lines or {}).items(), ("--", ":", "-."), strict=False):
        ax.axhline(value, linestyle=style, color="grey", linewidth=0.8, label=f"{label} ({value:.2f})")
    ax.set_xticks(
        x, names, rotation=30 if len(names) > 3 else 0, ha="right" if len(names) > 3 else "center", fontsize=8
    )
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.set_title(title, fontsize=9)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    if len(series) > 1 or reference_lines:
        ax.legend(fontsize=7)
    return _save(fig, path)


# Learning curves of a comparison: each strategy's ``curve.json`` (written by the strategy runner) drawn
# in one figure, strategies as lines: the SFT stage's progressive loss (targets not yet trained on) and
# the validation users' target NLL, against training steps.

# (name, y-axis label, curve part, value field): the SFT stage's progressive loss (first-epoch training
# windows: targets not yet trained on) and the validation users' trie-constrained target NLL
PANELS = (
    ("progressive", "progressive loss (nats per item, targets not yet trained on)", "train", "item_nll"),
    ("valid", "validation NLL (nats per item, SID trie)", "valid", "constrained_nll"),
)


def curve_stage(run_dir: str | Path, stage: str = "sft") -> dict[str, list] | None:
    """``{"train": [...], "valid": [...]}`` of one stage of a strategy run's ``curve.json`` (see
    :func:`peft_grounded.training.callbacks.learning_curve`), checked; ``None`` when the run wrote none."""
    path = Path(run_dir) / CURVE_FILE
    if not path.is_file():
        return None
    data = read_json(path)
    part = data.get(stage) if isinstance(data, dict) else None
    if not isinstance(part, dict) or not all(isinstance(part.get(k, []), list) for k in ("train", "valid")):
        raise ValueError(
            f"{path}: expected {{{stage!r}: {{'train': [...], 'valid': [...]}}}} as the strategy runner writes "
            "it; was the file written by another tool?"
        )
    return part


def read_curve(run_dir: str | Path, stage: str = "sft") -> dict[str, dict[int, float]] | None:
    """``{panel: {step: value}}`` of a strategy run's ``curve.json`` (:func:`curve_stage`), or ``None`` when it
    wrote none."""
    part = curve_stage(run_dir, stage)
    if part is None:
        return None
    series: dict[str, dict[int, float]] = {}
    for name, _, which, key in PANELS:
        rows = [r for r in part.get(which, []) if isinstance(r, dict) and "step" in r]
        if which == "train":
            rows = [r for r in rows if r.get("progressive", True)]
        series[name] = {int(r["step"]): float(r[key]) for r in rows if isinstance(r.get(key), (int, float))}
    return series


def _series(curves: Sequence[dict[str, dict[int, float]]], panel: str) -> tuple[list[int], list[float]]:
    """Steps and the value averaged over seeds (at the steps every seed measured)."""
    per_seed = [c.get(panel, {}) for c in curves]
    steps = sorted(set.intersection(*(set(s) for s in per_seed))) if per_seed else []
    return steps, [statistics.fmean(s[step] for s in per_seed) for step in steps]


def plot_learning_curves(
    curves: Mapping[str, Sequence[dict[str, dict[int, float]] | None]], path: str | Path
) -> Path | None:
    """One figure (a panel per measured quantity), a line per strategy (mean over seeds); ``None`` when no
    strategy has a curve."""
    curves = {name: [c for c in runs if c] for name, runs in curves.items()}
    curves = {name: runs for name, runs in curves.items() if runs}
    panels = [(p, label) for p, label, *_ in PANELS if any(_series(runs, p)[0] for runs in curves.values())]
    if not panels:
        return None
    from .._imports import require

    matplotlib = require("matplotlib", "the learning-curve figure")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, (prefix, label) in zip(axes[0], panels, strict=True):
        for name, runs in curves.items():
            steps, values = _series(runs, prefix)
            if steps:
                ax.plot(steps, values, marker="o", markersize=3, label=name)
        ax.set_xlabel("training step")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def curves_section(run_dirs: Mapping[str, Sequence[str | Path]], out_dir: str | Path) -> list[str]:
    """The report's learning-curve section: the plot (``learning_curves.png`` in ``out_dir``) or why none."""
    curves = {name: [read_curve(d) for d in dirs] for name, dirs in run_dirs.items()}
    lines = ["## Learning curves", ""]
    path = plot_learning_curves(curves, Path(out_dir) / "learning_curves.png")
    if path is None:
        return [
            *lines,
            f"_No strategy wrote a `{CURVE_FILE}` (learning curves are recorded by the training)._",
            "",
        ]
    seeds = max(len([c for c in runs if c]) for runs in curves.values())
    note = f" (mean over {seeds} seeds)" if seeds > 1 else ""
    return [
        *lines,
        f"Strategies as lines{note}: the progressive loss and the held-out NLL against training steps.",
        "",
        f"![learning curves]({path.name})",
        "",
    ]
