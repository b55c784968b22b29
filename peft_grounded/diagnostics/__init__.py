"""Diagnostics of the geometry of the new (SID) token rows, and a report comparing checkpoints.

* pure functions, one module per measure: :mod:`~peft_grounded.diagnostics.matrices` (checked rows,
  cosine similarities, SVDs), :mod:`~peft_grounded.diagnostics.spectra` (spectra and ranks),
  :mod:`~peft_grounded.diagnostics.similarity` (RSA), :mod:`~peft_grounded.diagnostics.purity`
  (neighbourhood purity), :mod:`~peft_grounded.diagnostics.popularity` (popularity R^2_q),
  :mod:`~peft_grounded.diagnostics.neighbours` (nearest vocabulary tokens) and
  :mod:`~peft_grounded.diagnostics.heatmaps` (heatmap selection);
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
from peft_grounded.diagnostics.heatmaps import HeatmapSelection, heatmap_matrix, select_heatmap_tokens
from peft_grounded.diagnostics.matrices import cosine_similarity_matrix
from peft_grounded.diagnostics.measure import (
    ReportConfig,
    SnapshotMetrics,
    measure_snapshot,
    measure_snapshots,
)
from peft_grounded.diagnostics.neighbours import NearestTokens, nearest_vocabulary
from peft_grounded.diagnostics.popularity import (
    PCRegression,
    PrincipalComponents,
    pc_regression_curve,
    pc_regression_r2,
    principal_components,
    principal_score,
)
from peft_grounded.diagnostics.purity import PurityResult, neighbourhood_purity
from peft_grounded.diagnostics.report import ReportFiles, write_report
from peft_grounded.diagnostics.similarity import RSAResult, rsa
from peft_grounded.diagnostics.snapshot import GeometrySnapshot, check_compatible
from peft_grounded.diagnostics.spectra import Spectrum, effective_rank, spectrum, stable_rank
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
