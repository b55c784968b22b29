"""Diagnostics of the geometry of the new (SID) token rows, and a report comparing checkpoints.

* :mod:`~peft_grounded.diagnostics.geometry`: pure functions (similarities, spectra and ranks,
  RSA, neighbourhood purity, popularity R^2_q, nearest vocabulary tokens, heatmap selection);
* :mod:`~peft_grounded.diagnostics.snapshot`: :class:`GeometrySnapshot`, one checkpoint's rows
  and the per-token data that switch diagnostics on;
* :mod:`~peft_grounded.diagnostics.measure`: :class:`ReportConfig` and every diagnostic of a snapshot;
* :mod:`~peft_grounded.diagnostics.report`: :func:`write_report` (markdown/HTML, PNG, JSON), built on
  :mod:`~peft_grounded.diagnostics.document` (markdown/HTML rendering) and
  :mod:`~peft_grounded.diagnostics.plots` (the figures; imports matplotlib).
"""

from peft_grounded.diagnostics.geometry import (
    HeatmapSelection,
    NearestTokens,
    PCRegression,
    PrincipalComponents,
    PurityResult,
    RSAResult,
    Spectrum,
    cosine_similarity_matrix,
    effective_rank,
    heatmap_matrix,
    nearest_vocabulary,
    neighbourhood_purity,
    pc_regression_curve,
    pc_regression_r2,
    principal_components,
    principal_score,
    rsa,
    select_heatmap_tokens,
    spectrum,
    stable_rank,
)
from peft_grounded.diagnostics.measure import (
    ReportConfig,
    SnapshotMetrics,
    measure_snapshot,
    measure_snapshots,
)
from peft_grounded.diagnostics.report import ReportFiles, write_report
from peft_grounded.diagnostics.snapshot import GeometrySnapshot, check_compatible

__all__ = [
    "GeometrySnapshot",
    "HeatmapSelection",
    "NearestTokens",
    "PCRegression",
    "PrincipalComponents",
    "PurityResult",
    "RSAResult",
    "ReportConfig",
    "ReportFiles",
    "SnapshotMetrics",
    "Spectrum",
    "check_compatible",
    "cosine_similarity_matrix",
    "effective_rank",
    "heatmap_matrix",
    "measure_snapshot",
    "measure_snapshots",
    "nearest_vocabulary",
    "neighbourhood_purity",
    "pc_regression_curve",
    "pc_regression_r2",
    "principal_components",
    "principal_score",
    "rsa",
    "select_heatmap_tokens",
    "spectrum",
    "stable_rank",
    "write_report",
]
