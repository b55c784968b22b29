"""Learning curves of a comparison: each strategy's ``curve.json`` (written by its training) drawn in one
figure, strategies as lines: the progressive loss (targets not yet trained on) and the held-out NLL.

Rows are dicts with a ``step`` (and ``seconds``, ``items``) and the measured values; the field names are
matched loosely (``progressive...``, ``valid...``) so that the section works as soon as the files appear.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

CURVE_FILE = "curve.json"
PANELS = (
    ("progressive", "progressive loss (nats, targets not yet trained on)"),
    ("valid", "validation NLL (nats)"),
)


def read_curve(run_dir: str | Path) -> list[dict[str, Any]] | None:
    """A run's curve rows, or ``None`` when it wrote none."""
    path = Path(run_dir) / CURVE_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    rows = data.get("rows", data.get("curve")) if isinstance(data, dict) else data
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "step" in r for r in rows):
        raise ValueError(f"{path}: expected a list of rows with a 'step' (or a dict holding one as 'rows')")
    return rows


def _field(rows: Sequence[Mapping[str, Any]], prefix: str) -> str | None:
    for key in rows[0] if rows else ():
        if key.lower().startswith(prefix) and isinstance(rows[0][key], (int, float)):
            return key
    for row in rows:  # the first row may lack a value measured later
        for key, value in row.items():
            if key.lower().startswith(prefix) and isinstance(value, (int, float)):
                return key
    return None


def _series(curves: Sequence[list[dict[str, Any]]], prefix: str) -> tuple[list[float], list[float]]:
    """Steps and the value averaged over seeds (at the steps every seed measured)."""
    per_seed = []
    for rows in curves:
        key = _field(rows, prefix)
        per_seed.append({r["step"]: r[key] for r in rows if key and isinstance(r.get(key), (int, float))})
    steps = sorted(set.intersection(*(set(s) for s in per_seed))) if per_seed else []
    return steps, [statistics.fmean(s[step] for s in per_seed) for step in steps]


def plot_learning_curves(
    curves: Mapping[str, Sequence[list[dict[str, Any]]]], path: str | Path
) -> Path | None:
    """One figure (a panel per measured quantity), a line per strategy (mean over seeds); ``None`` when no
    strategy has a curve."""
    curves = {name: [c for c in runs if c] for name, runs in curves.items()}
    curves = {name: runs for name, runs in curves.items() if runs}
    panels = [(p, label) for p, label in PANELS if any(_series(runs, p)[0] for runs in curves.values())]
    if not panels:
        return None
    import matplotlib

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
