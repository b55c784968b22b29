"""Diagnostics of the geometry of the new (SID) token rows, and a report comparing checkpoints.

* :mod:`~peft_grounded.diagnostics.geometry`: pure functions (similarities, spectra and ranks,
  RSA, neighbourhood purity, popularity R^2_q, nearest vocabulary tokens, heatmap selection);
* :mod:`~peft_grounded.diagnostics.snapshot`: :class:`GeometrySnapshot`, one checkpoint's rows
  and the per-token data that switch diagnostics on;
* :mod:`~peft_grounded.diagnostics.measure`: :class:`ReportConfig` and every diagnostic of a snapshot;
* :mod:`~peft_grounded.diagnostics.report`: :func:`write_report` (markdown/HTML, PNG, JSON), built on
  :mod:`~peft_grounded.diagnostics.document` (markdown/HTML rendering) and
  :mod:`~peft_grounded.diagnostics.plots` (the figures; imports matplotlib);
* :mod:`~peft_grounded.diagnostics.diagnose`: :func:`diagnose` (saved adapters + SID index -> report) and
  :func:`diagnose_runs` (a strategy runner's output folder -> report), on
  :mod:`~peft_grounded.diagnostics.checkpoints` (adapter rows, runner folders) and
  :mod:`~peft_grounded.diagnostics.vocabulary` (the base model's rows and token strings);
* :mod:`~peft_grounded.diagnostics.cli`: ``peft-grounded diagnose``.

Importing the package loads numpy only; torch, safetensors and transformers load when used.
"""

from peft_grounded.diagnostics.checkpoints import (
    AdapterRows,
    Checkpoint,
    RunFolder,
    checkpoint,
    find_run_checkpoints,
    load_sid_rows,
)
from peft_grounded.diagnostics.diagnose import diagnose, diagnose_runs
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
from peft_grounded.diagnostics.vocabulary import Vocabulary, load_vocabulary

__all__ = [
    "AdapterRows",
    "Checkpoint",
    "GeometrySnapshot",
    "HeatmapSelection",
    "NearestTokens",
    "PCRegression",
    "PrincipalComponents",
    "PurityResult",
    "RSAResult",
    "ReportConfig",
    "ReportFiles",
    "RunFolder",
    "SnapshotMetrics",
    "Spectrum",
    "Vocabulary",
    "check_compatible",
    "checkpoint",
    "cosine_similarity_matrix",
    "diagnose",
    "diagnose_runs",
    "effective_rank",
    "find_run_checkpoints",
    "heatmap_matrix",
    "load_sid_rows",
    "load_vocabulary",
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
