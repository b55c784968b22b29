"""Write a report comparing several snapshots side by side: markdown (HTML optional), PNGs, JSON.

A figure whose input no snapshot has (reference vectors, categories, frequencies, vocabulary rows)
is skipped, and the report says which and why.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peft_grounded._io import atomic_write_text
from peft_grounded.diagnostics.measure import (
    ReportConfig,
    SnapshotMetrics,
    measure_snapshots,
    metrics_to_dict,
)
from peft_grounded.diagnostics.report_sections import ReportSections, to_html, to_markdown
from peft_grounded.diagnostics.snapshot import GeometrySnapshot, HeatmapSelection

# what write_report writes; metrics.json first: it tells an earlier report of its own from another tool's files
REPORT_FILES = ("metrics.json", "report.md", "report.html", "nearest_vocabulary.json", "figures")


def _is_report_metrics(value: Any) -> bool:
    return isinstance(value, dict) and {"config", "heatmap", "snapshots"} <= set(value)


def check_report_output(out_dir: str | os.PathLike[str]) -> None:
    """Raise ``ValueError`` unless ``out_dir`` may receive a report: a training run's folder, or files of the
    report's names that another tool wrote, are refused (see :func:`peft_grounded._io.check_report_folder`)."""
    from peft_grounded._io import check_report_folder

    check_report_folder(
        Path(out_dir), "`peft-grounded diagnose`", REPORT_FILES, _is_report_metrics, "--output_dir"
    )


@dataclass
class ReportFiles:
    """What :func:`write_report` wrote, and the measurements behind it."""

    markdown: Path
    metrics_json: Path
    nearest_json: Path | None
    html: Path | None
    figures: dict[str, Path]
    skipped: list[str]  # one sentence per figure left out, also in the report
    selection: HeatmapSelection
    metrics: list[SnapshotMetrics]


def write_report(
    out_dir: str | os.PathLike[str],
    snapshots: Sequence[GeometrySnapshot],
    config: ReportConfig | None = None,
    intro: Sequence[str] = (),
) -> ReportFiles:
    """Measure ``snapshots`` (same SID tokens, any stages) and write the comparison into ``out_dir``.

    ``intro``: sentences listed under the title (where the inputs came from, what was left out).

    Writes ``report.md`` (and ``report.html`` if ``config.html``), ``figures/*.png``,
    ``metrics.json`` (every number; undefined values as null) and ``nearest_vocabulary.json`` (when
    vocabulary rows were given), each atomically. Mismatched snapshots raise ``ValueError`` before
    anything is written; so does an ``out_dir`` holding a training run or another tool's files of those
    names (:func:`check_report_output`). ``out_dir`` is locked while the report is written.
    """
    from peft_grounded._io import output_lock

    with output_lock(out_dir, "diagnose"):
        check_report_output(out_dir)
        return _write_report(out_dir, snapshots, config or ReportConfig(), intro)


def _write_report(
    out_dir: str | os.PathLike[str],
    snapshots: Sequence[GeometrySnapshot],
    config: ReportConfig,
    intro: Sequence[str],
) -> ReportFiles:
    selection, metrics = measure_snapshots(snapshots, config)
    report = ReportSections(Path(out_dir), list(snapshots), metrics, selection, config)
    if intro:
        report.blocks.append(("list", list(intro)))
    for section in (
        report.overview,
        report.heatmaps,
        report.spectra,
        report.rsa,
        report.purity,
        report.r2,
        report.nearest,
        report.notes,
    ):
        section()
    out = report.out
    metrics_json = atomic_write_text(
        out / "metrics.json",
        json.dumps(_nan_to_none(metrics_to_dict(metrics, selection, snapshots, config)), indent=1) + "\n",
    )
    markdown = atomic_write_text(out / "report.md", to_markdown(config.title, report.blocks) + "\n")
    html_path = (
        atomic_write_text(out / "report.html", to_html(config.title, report.blocks)) if config.html else None
    )
    return ReportFiles(
        markdown,
        metrics_json,
        report.nearest_json,
        html_path,
        report.figures,
        report.skipped,
        selection,
        metrics,
    )


def _nan_to_none(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nan_to_none(v) for v in value]
    return value
