"""Measure snapshots: every diagnostic that a snapshot's data allows, with a note for each one skipped.

The popularity regression it reports (principal components of the rows against item popularity, R^2_q) is
below.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from peft_grounded.diagnostics.matrices import (
    RTOL,
    NearestTokens,
    PurityResult,
    RSAResult,
    SimilarityPairs,
    Spectrum,
    as_matrix,
    as_vector,
    nearest_vocabulary,
    neighbourhood_purity,
    rsa,
    similarity_pairs,
    spectrum,
    thin_svd,
    unit_rows,
)
from peft_grounded.diagnostics.snapshot import (
    GeometrySnapshot,
    HeatmapSelection,
    check_compatible,
    heatmap_matrix,
    select_heatmap_tokens,
)
from peft_grounded.sids.index import level_name


@dataclass(frozen=True)
class ReportConfig:
    """Knobs of the report; the defaults follow the papers (METHODS.md)."""

    title: str = "Geometry of the SID tokens"
    n_text: int = 50  # heatmap: text tokens (GTI paper: 50 + 50)
    n_sid: int = 50  # heatmap: SID tokens
    text_ids: Sequence[int] | None = None  # heatmap text tokens; default: seeded sample of the vocabulary
    strict: bool = False  # fewer tokens than asked for: raise instead of clamping with a note
    purity_m: int = 10  # P_10, as in the centroid paper
    r2_q: int = 3  # R^2 of the top 3 PCs, as in the centroid paper
    r2_max_q: int = 10  # R^2_q curve for q = 1..r2_max_q
    cv_folds: int = 0  # 0: in-sample R^2 (the paper's figure); k >= 2: k-fold out-of-fold R^2
    popularity_transform: str = "none"  # "none" (Theorem 3.1: drift linear in frequency) or "log1p"
    nearest_k: int = 5  # nearest vocabulary tokens per SID token
    nearest_shown: int = 12  # SID tokens per snapshot in the markdown table (all go to the JSON)
    html: bool = False  # also write report.html
    seed: int = 0

    def __post_init__(self) -> None:
        from .. import checks

        least = checks.int_at_least
        checks.raise_problems(
            "ReportConfig",
            [
                least("n_text", self.n_text, 0, flag="--n-text"),
                least("n_sid", self.n_sid, 1, flag="--n-sid"),
                least("purity_m", self.purity_m, 1, flag="--purity-m"),
                least("r2_q", self.r2_q, 1, flag="--r2-q"),
                least("r2_max_q", self.r2_max_q, 1),
                None if self.cv_folds == 0 else least("cv_folds", self.cv_folds, 2),
                checks.one_of("popularity_transform", self.popularity_transform, ("none", "log1p")),
                least("nearest_k", self.nearest_k, 1, flag="--nearest-k"),
                least("nearest_shown", self.nearest_shown, 0),
                checks.seed("seed", self.seed),
            ],
        )


@dataclass
class SnapshotMetrics:
    """Every diagnostic of one snapshot; ``None`` where its input was missing (see ``notes``)."""

    name: str
    stage: str
    n_tokens: int
    width: int
    spectrum: Spectrum
    spectrum_centred: Spectrum
    heatmap: np.ndarray
    rsa: RSAResult | None = None
    rsa_centred: RSAResult | None = None  # both sides mean-centred: blind to a shared offset
    rsa_by_level: dict[str, RSAResult] = field(default_factory=dict)
    purity: PurityResult | None = None
    purity_reference: PurityResult | None = None
    popularity_r2: list[PCRegression] | None = None  # q = 1..r2_max_q
    semantic_r2: list[PCRegression] | None = None
    nearest: NearestTokens | None = None
    notes: list[str] = field(default_factory=list)

    def r2_at(self, q: int, which: str = "popularity") -> float | None:
        curve = self.popularity_r2 if which == "popularity" else self.semantic_r2
        return None if curve is None or q > len(curve) else curve[q - 1].r2


class SharedInputs:
    """Work shared by the snapshots of one report: a reference's PCA and similarity pairs, the unit
    vocabulary. Keyed by object identity, so it lives only as long as one :func:`measure_snapshots`."""

    def __init__(self) -> None:
        self._store: dict[tuple[Any, ...], tuple[Any, Any]] = {}

    def get(self, kind: str, source: Any, compute: Callable[[], Any], *extra: Any) -> Any:
        key = (kind, id(source), *extra)
        if key not in self._store:
            self._store[key] = (source, compute())  # holding ``source`` keeps its id unique
        return self._store[key][1]


def measure_snapshots(
    snapshots: Sequence[GeometrySnapshot], config: ReportConfig | None = None
) -> tuple[HeatmapSelection, list[SnapshotMetrics]]:
    """Check the snapshots agree, pick one heatmap selection for all of them and measure each."""
    config = config or ReportConfig()
    if config.popularity_transform not in ("none", "log1p"):
        raise ValueError(
            f"popularity_transform must be 'none' or 'log1p', got {config.popularity_transform!r}"
        )
    check_compatible(snapshots)
    first = snapshots[0]
    with_vocab = next((s for s in snapshots if s.vocab_rows is not None), None)
    selection = select_heatmap_tokens(
        first.sid_tokens,
        n_sid=config.n_sid,
        vocab_size=None if with_vocab is None else with_vocab.vocab_size,
        n_text=config.n_text,
        sid_levels=first.levels(),
        text_ids=config.text_ids,
        exclude_ids=None if with_vocab is None else with_vocab.exclude_vocab_ids,
        seed=config.seed,
        strict=config.strict,
    )
    shared = SharedInputs()
    return selection, [measure_snapshot(s, selection, config, shared) for s in snapshots]


def measure_snapshot(
    snapshot: GeometrySnapshot,
    selection: HeatmapSelection,
    config: ReportConfig | None = None,
    shared: SharedInputs | None = None,
) -> SnapshotMetrics:
    """All diagnostics of one snapshot that its fields allow (``shared``: reuse work across snapshots)."""
    config = config or ReportConfig()
    shared = shared or SharedInputs()
    rows = as_matrix(snapshot.sid_rows, f"SID rows of snapshot {snapshot.name!r}")
    heatmap_selection = selection
    if selection.text_ids.size and snapshot.vocab_rows is None:
        heatmap_selection = HeatmapSelection(
            selection.text_ids[:0], selection.sid_indices, selection.sid_groups, selection.notes
        )
    pcs = principal_components(rows)  # one SVD for the centred spectrum and every R^2 target
    metrics = SnapshotMetrics(
        name=snapshot.name,
        stage=snapshot.stage,
        n_tokens=snapshot.n_tokens,
        width=snapshot.width,
        spectrum=spectrum(rows, center=False),
        spectrum_centred=Spectrum.from_singular_values(pcs.singular_values, centred=True),
        heatmap=heatmap_matrix(rows, heatmap_selection, snapshot.vocab_rows),
    )
    if heatmap_selection is not selection:
        metrics.notes.append("no vocabulary rows: its heatmap shows SID tokens only")
    levels = snapshot.levels()
    reference = None if snapshot.reference is None else as_matrix(snapshot.reference, "reference vectors")
    _measure_rsa(metrics, rows, snapshot.reference, reference, levels, shared)
    _measure_purity(metrics, rows, reference, levels, snapshot.categories, config)
    _measure_r2(metrics, pcs, reference, snapshot, config, shared)
    if snapshot.vocab_rows is None:
        metrics.notes.append("no vocabulary rows: nearest vocabulary tokens skipped")
    else:
        eligible = snapshot.vocab_size - len(set(snapshot.exclude_vocab_ids or ()))
        vocab = shared.get("unit vocabulary", snapshot.vocab_rows, lambda: unit_rows(snapshot.vocab_rows))
        metrics.nearest = nearest_vocabulary(
            rows,
            vocab,
            k=min(config.nearest_k, eligible),
            exclude_ids=snapshot.exclude_vocab_ids,
        )
    return metrics


def _measure_rsa(
    metrics: SnapshotMetrics,
    rows: np.ndarray,
    source: Any,
    reference: np.ndarray | None,
    levels: list[int] | None,
    shared: SharedInputs,
) -> None:
    if reference is None:
        metrics.notes.append("no reference vectors (codebooks / centroids): RSA skipped")
        return
    if rows.shape[0] < 3:
        metrics.notes.append("fewer than 3 SID tokens: RSA skipped")
        return

    def pairs(center: bool, members: np.ndarray | None = None) -> SimilarityPairs:
        key = None if members is None else members.tobytes()
        vectors = reference if members is None else reference[members]
        return shared.get("rsa", source, lambda: similarity_pairs(vectors, center), center, key)

    metrics.rsa = rsa(pairs(False), rows)
    metrics.rsa_centred = rsa(pairs(True), rows, center=True)
    if levels is not None and len(set(levels)) > 1:
        for level in sorted(set(levels)):
            members = np.flatnonzero(np.asarray(levels) == level)
            if members.size >= 3:
                metrics.rsa_by_level[level_name(level)] = rsa(pairs(False, members), rows[members])


def _measure_purity(
    metrics: SnapshotMetrics,
    rows: np.ndarray,
    reference: np.ndarray | None,
    levels: list[int] | None,
    categories: Sequence[str | None] | None,
    config: ReportConfig,
) -> None:
    if categories is None:
        metrics.notes.append("no categories: neighbourhood purity skipped")
        return
    if levels is None:
        metrics.notes.append(
            "token levels unknown (non-default token template, no sid_levels): purity skipped"
        )
        return
    labels = [c if level == 0 and c else None for c, level in zip(categories, levels, strict=True)]
    n = sum(label is not None for label in labels)
    if n < 2:
        metrics.notes.append(f"{n} level-0 token(s) with a category (2 needed): purity skipped")
        return
    m = min(config.purity_m, n - 1)
    if m < config.purity_m:
        metrics.notes.append(
            f"only {n} labelled level-0 tokens: purity uses m={m} instead of {config.purity_m}"
        )
    metrics.purity = neighbourhood_purity(rows, labels, m)
    if reference is not None:
        metrics.purity_reference = neighbourhood_purity(reference, labels, m)


def _measure_r2(
    metrics: SnapshotMetrics,
    pcs: PrincipalComponents,
    reference: np.ndarray | None,
    snapshot: GeometrySnapshot,
    config: ReportConfig,
    shared: SharedInputs,
) -> None:
    n = pcs.n_rows
    folds = config.cv_folds
    if folds and n < 2 * folds:
        metrics.notes.append(f"{n} tokens are too few for {folds}-fold CV: R^2 is in-sample")
        folds = 0
    max_q = max(config.r2_max_q, config.r2_q)
    if snapshot.frequencies is None:
        metrics.notes.append("no code frequencies: popularity R^2 skipped")
    else:
        target = as_vector(snapshot.frequencies, n, "frequencies")
        if config.popularity_transform == "log1p":
            target = np.log1p(target)
        metrics.popularity_r2 = pc_regression_curve(pcs, target, max_q, folds, config.seed)
    semantic = snapshot.semantic_target
    if semantic is None and reference is not None:
        scores = shared.get("pca", snapshot.reference, lambda: principal_components(reference)).scores
        semantic = scores[:, 0] if scores.shape[1] else None
    if semantic is None:
        metrics.notes.append("no semantic target (no reference vectors): semantic R^2 skipped")
    else:
        target = as_vector(semantic, n, "semantic target")
        metrics.semantic_r2 = pc_regression_curve(pcs, target, max_q, folds, config.seed)


def metrics_to_dict(
    metrics: list[SnapshotMetrics],
    selection: HeatmapSelection,
    snapshots: Sequence[GeometrySnapshot],
    config: ReportConfig,
) -> dict[str, Any]:
    """Every number of the measurements as JSON-ready values (NaN stays NaN; the writer maps it to null)."""

    def rsa_dict(r: RSAResult | None) -> dict[str, Any] | None:
        return None if r is None else {"pearson": r.pearson, "spearman": r.spearman, "n_pairs": r.n_pairs}

    def purity_dict(p: PurityResult | None) -> dict[str, Any] | None:
        return (
            None if p is None else {"value": p.purity, "chance": p.chance, "m": p.m, "n_tokens": p.n_tokens}
        )

    def curve(c: list[PCRegression] | None) -> list[dict[str, Any]] | None:
        return None if c is None else [{"q_requested": i + 1, "q": r.q, "r2": r.r2} for i, r in enumerate(c)]

    return {
        "config": {
            k: (list(v) if isinstance(v, Sequence) and not isinstance(v, str) else v)
            for k, v in config.__dict__.items()
        },
        "heatmap": {
            "text_ids": selection.text_ids.tolist(),
            "sid_tokens": [snapshots[0].sid_tokens[i] for i in selection.sid_indices],
            "notes": list(selection.notes),
        },
        "snapshots": [
            {
                "name": m.name,
                "stage": m.stage,
                "n_tokens": m.n_tokens,
                "width": m.width,
                "effective_rank": m.spectrum.effective_rank,
                "effective_rank_centred": m.spectrum_centred.effective_rank,
                "stable_rank": m.spectrum.stable_rank,
                "stable_rank_centred": m.spectrum_centred.stable_rank,
                "singular_values": m.spectrum.singular_values.tolist(),
                "singular_values_centred": m.spectrum_centred.singular_values.tolist(),
                "rsa": rsa_dict(m.rsa),
                "rsa_centred": rsa_dict(m.rsa_centred),
                "rsa_by_level": {k: rsa_dict(v) for k, v in m.rsa_by_level.items()},
                "purity": purity_dict(m.purity),
                "purity_reference": purity_dict(m.purity_reference),
                "popularity_r2": curve(m.popularity_r2),
                "semantic_r2": curve(m.semantic_r2),
                "notes": m.notes,
            }
            for m in metrics
        ],
    }


# Popularity R^2_q: how well the top principal components of the SID rows predict a per-token target.


@dataclass(frozen=True)
class PrincipalComponents:
    """PCA of rows: scores on the non-degenerate components, and the centred rows' singular values."""

    scores: np.ndarray  # (n, k) by decreasing variance; components under the tolerance are left out
    singular_values: np.ndarray  # all of them, descending, those under the tolerance set to 0

    @property
    def n_rows(self) -> int:
        return self.scores.shape[0]


def principal_components(rows: Any) -> PrincipalComponents:
    """PCA of the mean-centred rows (one SVD; reuse it for the centred spectrum and every R^2 target).

    Singular values under ``RTOL * ||rows||_F`` (of the rows before centring) count as zero.
    """
    if isinstance(rows, PrincipalComponents):
        return rows
    matrix = as_matrix(rows)
    tol = RTOL * float(np.linalg.norm(matrix))
    u, s = thin_svd(matrix - matrix.mean(axis=0, keepdims=True))
    keep = s > tol
    return PrincipalComponents(u[:, keep] * s[keep], np.where(keep, s, 0.0))


def principal_score(vectors: Any, component: int = 0) -> np.ndarray:
    """Each vector's coordinate on one principal component: a scalar semantic target for contrast."""
    scores = principal_components(vectors).scores
    if component >= scores.shape[1]:
        raise ValueError(f"the vectors have only {scores.shape[1]} non-degenerate principal components")
    return scores[:, component]


@dataclass(frozen=True)
class PCRegression:
    """R^2 of a linear regression of a per-token target on the top-q principal components."""

    r2: float
    q: int
    cross_validated: bool
    folds: int


def pc_regression_curve(
    rows: Any, target: Any, max_q: int = 10, cv_folds: int = 0, seed: int = 0
) -> list[PCRegression]:
    """:func:`pc_regression_r2` for q = 1..max_q (q clamped as there), principal components computed once."""
    pcs = principal_components(rows)
    y = as_vector(target, pcs.n_rows, "target")
    folds = _folds(pcs.n_rows, cv_folds, seed)
    return [_fit(pcs.scores, y, q, folds) for q in range(1, max_q + 1)]


def pc_regression_r2(rows: Any, target: Any, q: int = 3, cv_folds: int = 0, seed: int = 0) -> PCRegression:
    """How well the top-``q`` principal components of ``rows`` predict ``target`` (ordinary least squares).

    ``rows`` may also be their :func:`principal_components`, computed once for several targets.

    The principal components come from the mean-centred rows, without the target, so they may be
    computed on all rows even when cross-validating. ``cv_folds=0``: in-sample R^2 (in [0, 1]).
    ``cv_folds=k >= 2``: out-of-fold predictions from k shuffled folds (seeded),
    ``R^2 = 1 - PRESS / SS_tot``, which may be negative. ``q`` is clamped to the non-degenerate
    components and so that every fit keeps a residual degree of freedom; ``result.q`` is the q used
    (0 for identical rows, whose R^2 is then 0). A constant target gives NaN.
    """
    if q < 1:
        raise ValueError(f"q must be >= 1, got {q}")
    pcs = principal_components(rows)
    y = as_vector(target, pcs.n_rows, "target")
    return _fit(pcs.scores, y, q, _folds(pcs.n_rows, cv_folds, seed))


def _folds(n: int, cv_folds: int, seed: int) -> list[np.ndarray]:
    if cv_folds == 0:
        return []
    if cv_folds < 2:
        raise ValueError(f"cv_folds must be 0 (in-sample) or >= 2, got {cv_folds}")
    if n < 2 * cv_folds:
        raise ValueError(f"{cv_folds}-fold cross-validation needs at least {2 * cv_folds} tokens, got {n}")
    order = np.random.default_rng(seed).permutation(n)
    return np.array_split(order, cv_folds)


def _fit(scores: np.ndarray, y: np.ndarray, q: int, folds: list[np.ndarray]) -> PCRegression:
    n = y.shape[0]
    smallest_fit = n - max((len(f) for f in folds), default=0)
    q = max(0, min(q, scores.shape[1], smallest_fit - 2))
    ss_tot = float(((y - y.mean()) ** 2).sum())
    if ss_tot <= 0:
        return PCRegression(float("nan"), q, bool(folds), len(folds))
    design = np.hstack([np.ones((n, 1)), scores[:, :q]])
    if not folds:
        coef, *_ = np.linalg.lstsq(design, y, rcond=None)
        residual = y - design @ coef
    else:
        residual = np.empty(n)
        for held_out in folds:
            train = np.setdiff1d(np.arange(n), held_out)
            coef, *_ = np.linalg.lstsq(design[train], y[train], rcond=None)
            residual[held_out] = y[held_out] - design[held_out] @ coef
    return PCRegression(1.0 - float((residual**2).sum()) / ss_tot, q, bool(folds), len(folds))
