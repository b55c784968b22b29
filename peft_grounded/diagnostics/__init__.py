"""Diagnostics of the geometry of the new (SID) token rows, and a report comparing checkpoints.

* :mod:`~peft_grounded.diagnostics.matrices`: the pure measures on rows (checked matrices, cosine
  similarities, SVDs, spectra and ranks, RSA, neighbourhood purity, nearest vocabulary tokens);
* :mod:`~peft_grounded.diagnostics.snapshot`: :class:`GeometrySnapshot`, one checkpoint's rows and the
  per-token data that switch diagnostics on, and the heatmap selection;
* :mod:`~peft_grounded.diagnostics.measure`: :class:`ReportConfig` and every diagnostic of a snapshot
  (popularity R^2_q among them);
* :mod:`~peft_grounded.diagnostics.report`: :func:`write_report` (markdown/HTML, PNG, JSON), built on
  :mod:`~peft_grounded.diagnostics.report_sections` (the sections and their markdown/HTML rendering) and
  :mod:`~peft_grounded.diagnostics.plots` (every figure of the package, learning curves too; imports
  matplotlib);
* :mod:`~peft_grounded.diagnostics.diagnose`: :func:`diagnose` (saved adapters + SID index -> report) and
  :func:`diagnose_runs` (a strategy runner's output folder -> report), on
  :mod:`~peft_grounded.diagnostics.rows` (adapter rows, runner folders, the base model's rows and token
  strings); ``peft-grounded diagnose`` is :mod:`peft_grounded.cli.diagnose`.

Importing the package loads numpy only; torch, safetensors and transformers load when used.
"""

from peft_grounded.diagnostics.diagnose import diagnose, diagnose_runs
from peft_grounded.diagnostics.matrices import (
    NearestTokens,
    PurityResult,
    RSAResult,
    Spectrum,
    cosine_similarity_matrix,
    effective_rank,
    nearest_vocabulary,
    neighbourhood_purity,
    rsa,
    spectrum,
    stable_rank,
)
from peft_grounded.diagnostics.measure import (
    PCRegression,
    PrincipalComponents,
    ReportConfig,
    SnapshotMetrics,
    measure_snapshot,
    measure_snapshots,
    pc_regression_curve,
    pc_regression_r2,
    principal_components,
    principal_score,
)
from peft_grounded.diagnostics.report import ReportFiles, write_report
from peft_grounded.diagnostics.rows import (
    AdapterRows,
    Checkpoint,
    RunFolder,
    Vocabulary,
    checkpoint,
    find_run_checkpoints,
    load_sid_rows,
    load_vocabulary,
)
from peft_grounded.diagnostics.snapshot import (
    GeometrySnapshot,
    HeatmapSelection,
    check_compatible,
    heatmap_matrix,
    select_heatmap_tokens,
)

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
