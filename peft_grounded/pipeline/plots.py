"""Learning curves of a comparison: each strategy's ``curve.json`` (written by the strategy runner) drawn
in one figure, strategies as lines: the SFT stage's progressive loss (targets not yet trained on) and
the validation users' target NLL, against training steps.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

from .._io import read_json
from ..training.runs import CURVE_FILE

# (name, y-axis label, curve part, value field): the SFT stage's progressive loss (first-epoch training
# windows: targets not yet trained on) and the validation users' trie-constrained target NLL
PANELS = (
    ("progressive", "progressive loss (nats per item, targets not yet trained on)", "train", "item_nll"),
    ("valid", "validation NLL (nats per item, SID trie)", "valid", "constrained_nll"),
)


def read_curve(run_dir: str | Path, stage: str = "sft") -> dict[str, dict[int, float]] | None:
    """``{panel: {step: value}}`` of a strategy run's ``curve.json`` (see
    :func:`peft_grounded.recommend.callbacks.learning_curve`), or ``None`` when it wrote none."""
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
    from .._extras import require

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
