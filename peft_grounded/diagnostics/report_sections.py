"""The sections of a diagnostics report (overview, heatmaps, spectra, RSA, purity, R^2, nearest vocabulary,
notes), built as document blocks and figures by :class:`ReportSections`; :mod:`.report` writes the files.

The markdown/HTML rendering they are written in (:class:`Block`, :class:`Code`, ...) is below.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from peft_grounded._io import atomic_write_text
from peft_grounded.diagnostics.measure import (
    ReportConfig,
    SnapshotMetrics,
)
from peft_grounded.diagnostics.snapshot import GeometrySnapshot, HeatmapSelection, select_heatmap_tokens

# what write_report writes; metrics.json first: it tells an earlier report of its own from another tool's files


def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None or math.isnan(value):
        return "n/a"
    return f"{value:.{digits}f}"


def _nan_if_none(results: Sequence[Any], get: Callable[[Any], float]) -> list[float]:
    return [float("nan") if r is None else get(r) for r in results]


@dataclass
class ReportSections:
    """Builds the report section by section: blocks for the document, figures, skipped figures."""

    out: Path
    snapshots: list[GeometrySnapshot]
    metrics: list[SnapshotMetrics]
    selection: HeatmapSelection
    config: ReportConfig
    blocks: list[Block] = field(default_factory=list)
    figures: dict[str, Path] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    nearest_json: Path | None = None

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.metrics]

    @property
    def labels(self) -> list[str]:
        return [f"{m.name} ({m.stage})" if m.stage else m.name for m in self.metrics]

    def figure(self, key: str, plot: Callable[..., Path], *args: Any, **kwargs: Any) -> None:
        self.figures[key] = plot(self.out / "figures" / f"{key}.png", *args, **kwargs)
        self.blocks.append(("img", f"figures/{key}.png", key))

    def skip(self, reason: str) -> None:
        self.skipped.append(reason)
        self.blocks.append(("p", f"Skipped: {reason}"))

    # -------------------------------------------------------------------------------------- sections

    def overview(self) -> None:
        q = self.config.r2_q
        m_purity = next(
            (m.purity.m for m in self.metrics if m.purity), self.config.purity_m
        )  # m may be clamped
        self.blocks += [
            ("h", "Snapshots"),
            (
                "table",
                [
                    "snapshot",
                    "stage",
                    "SID tokens",
                    "width",
                    "reference",
                    "categories",
                    "frequencies",
                    "vocabulary",
                ],
                [
                    [s.name, s.stage or "-", s.n_tokens, s.width]
                    + [
                        "yes" if x is not None else "no"
                        for x in (s.reference, s.categories, s.frequencies, s.vocab_rows)
                    ]
                    for s in self.snapshots
                ],
            ),
            ("h", "Summary"),
            (
                "p",
                "Effective rank: exp of the entropy of the normalised singular values (Roy & Vetterli), on the "
                "raw rows (the geometry the LM sees) and on mean-centred rows (the spread around the shared "
                "offset). Stable rank: ||A||_F^2 / ||A||_2^2 of the raw rows. RSA: correlation of the upper "
                "triangles of the cosine-similarity matrices of the reference vectors and of the SID rows; "
                "centred: both sides minus their mean vector first, blind to a shared offset such as the "
                "vocabulary mean that the centroid init adds. "
                f"P_{m_purity}: share of a level-0 token's nearest neighbours with its category. R^2_{q}: linear "
                f"regression of a per-token target on the top-{q} principal components of the SID rows, "
                + ("in-sample." if not self.config.cv_folds else f"{self.config.cv_folds}-fold out-of-fold.")
                + " n/a: undefined (e.g. RSA of identical rows) or input missing (see the notes).",
            ),
            (
                "table",
                [
                    "snapshot",
                    "stage",
                    "eff. rank",
                    "eff. rank (centred)",
                    "stable rank",
                    "RSA Pearson",
                    "RSA Spearman",
                    "RSA Pearson (centred)",
                    f"P_{m_purity}",
                    f"P_{m_purity} reference",
                    "chance",
                    f"R^2_{q} popularity",
                    f"R^2_{q} semantic",
                ],
                [
                    [
                        m.name,
                        m.stage or "-",
                        _fmt(m.spectrum.effective_rank, 2),
                        _fmt(m.spectrum_centred.effective_rank, 2),
                        _fmt(m.spectrum.stable_rank, 2),
                        _fmt(m.rsa.pearson if m.rsa else None),
                        _fmt(m.rsa.spearman if m.rsa else None),
                        _fmt(m.rsa_centred.pearson if m.rsa_centred else None),
                        _fmt(m.purity.purity if m.purity else None),
                        _fmt(m.purity_reference.purity if m.purity_reference else None),
                        _fmt(m.purity.chance if m.purity else None),
                        _fmt(m.r2_at(q)),
                        _fmt(m.r2_at(q, "semantic")),
                    ]
                    for m in self.metrics
                ],
            ),
        ]

    def heatmaps(self) -> None:
        from peft_grounded.diagnostics import plots

        selection = self.selection
        groups = ["text"] * selection.text_ids.size + list(selection.sid_groups)
        matrices = []
        for m in self.metrics:  # a snapshot without vocabulary rows gets an empty text block
            pad = len(groups) - m.heatmap.shape[0]
            matrices.append(np.pad(m.heatmap, ((pad, 0), (pad, 0)), constant_values=np.nan))
        self.blocks.append(("h", "Cosine similarity: text tokens and SID tokens"))
        self.blocks.append(
            (
                "p",
                f"{selection.text_ids.size} text tokens, then {selection.sid_indices.size} SID tokens ordered by "
                "level and code (lines separate the blocks); the same tokens in every panel.",
            )
        )
        self.figure("heatmaps", plots.plot_heatmaps, matrices, self.labels, groups)
        if selection.notes:
            self.blocks.append(("list", list(selection.notes)))

    def spectra(self) -> None:
        from peft_grounded.diagnostics import plots

        self.blocks.append(("h", "Singular-value spectrum"))
        pairs = list(zip(self.labels, self.metrics, strict=True))
        panels = {
            "raw rows": {label: m.spectrum.singular_values for label, m in pairs},
            "mean-centred rows": {label: m.spectrum_centred.singular_values for label, m in pairs},
        }
        self.figure("spectra", plots.plot_curves, panels, "index", "singular value", logy=True)
        ranks = {
            "effective rank": [m.spectrum.effective_rank for m in self.metrics],
            "effective rank (centred)": [m.spectrum_centred.effective_rank for m in self.metrics],
            "stable rank": [m.spectrum.stable_rank for m in self.metrics],
        }
        self.figure("ranks", plots.plot_bars, self.names, ranks, "Rank of the SID rows", "rank")

    def rsa(self) -> None:
        from peft_grounded.diagnostics import plots

        self.blocks.append(("h", "RSA against the reference vectors"))
        results = [m.rsa for m in self.metrics]
        if all(r is None for r in results):
            self.skip("RSA: no snapshot has reference vectors (pass the SID index's codebooks or centroids).")
            return
        series = {
            "Pearson": _nan_if_none(results, lambda r: r.pearson),
            "Spearman": _nan_if_none(results, lambda r: r.spearman),
            "Pearson (centred)": _nan_if_none([m.rsa_centred for m in self.metrics], lambda r: r.pearson),
        }
        self.figure(
            "rsa",
            plots.plot_bars,
            self.names,
            series,
            "RSA: reference vs SID-row cosine similarities",
            "correlation",
            reference_lines={"no relation": 0.0},
        )
        levels = sorted({k for m in self.metrics for k in m.rsa_by_level}, key=lambda k: (len(k), k))
        if levels:
            rows = [
                [m.name]
                + [
                    f"{_fmt(r.pearson)} / {_fmt(r.spearman)}" if (r := m.rsa_by_level.get(k)) else "n/a"
                    for k in levels
                ]
                for m in self.metrics
            ]
            self.blocks += [
                ("p", "Per level (Pearson / Spearman):"),
                ("table", ["snapshot", *[f"level {k}" for k in levels]], rows),
            ]

    def purity(self) -> None:
        from peft_grounded.diagnostics import plots

        self.blocks.append(("h", "Neighbourhood purity of level-0 tokens"))
        results = [m.purity for m in self.metrics]
        first = next((r for r in results if r is not None), None)
        if first is None:
            self.skip(
                "Neighbourhood purity: the catalogue gives no categories for the level-0 tokens "
                "(or their levels are unknown), so purity cannot be measured."
            )
            return
        series = {"SID rows": _nan_if_none(results, lambda r: r.purity)}
        if any(m.purity_reference is not None for m in self.metrics):
            series["reference vectors"] = _nan_if_none(
                [m.purity_reference for m in self.metrics], lambda r: r.purity
            )
        self.figure(
            "purity",
            plots.plot_bars,
            self.names,
            series,
            f"Neighbourhood purity P_{first.m} of {first.n_tokens} level-0 tokens",
            "purity",
            reference_lines={"chance": first.chance},
            ylim=(0.0, 1.05),
        )

    def r2(self) -> None:
        from peft_grounded.diagnostics import plots

        self.blocks.append(("h", "Popularity vs semantics: R^2 of the top-q principal components"))
        panels: dict[str, dict[str, Sequence[float]]] = {}
        for title, attribute in (("code frequency", "popularity_r2"), ("semantic target", "semantic_r2")):
            curves = {
                label: [r.r2 for r in curve]
                for label, m in zip(self.labels, self.metrics, strict=True)
                if (curve := getattr(m, attribute)) is not None
            }
            if curves:
                panels[title] = curves
        if panels:
            log = " (log1p)" if self.config.popularity_transform == "log1p" else ""
            self.blocks.append(
                (
                    "p",
                    f"Code frequency{log} and, as contrast, a semantic target (default: each token's reference "
                    "vector's score on the reference's first principal component), regressed on the top-q "
                    "principal components of the SID rows.",
                )
            )
            self.figure("r2", plots.plot_curves, panels, "q (top principal components)", "R^2")
        if "code frequency" not in panels:
            self.skip("Popularity R^2: no snapshot has code frequencies.")
        if "semantic target" not in panels:
            self.skip("Semantic R^2: no snapshot has reference vectors or a semantic target.")

    def nearest(self) -> None:
        self.blocks.append(("h", "Nearest vocabulary tokens"))
        first = self.snapshots[0]
        shown = select_heatmap_tokens(
            first.sid_tokens,
            min(self.config.nearest_shown, first.n_tokens),
            n_text=0,
            sid_levels=first.levels(),
        ).sid_indices
        data: dict[str, dict[str, list[list[Any]]]] = {}
        for snapshot, m in zip(self.snapshots, self.metrics, strict=True):
            if m.nearest is None:
                continue
            neighbours = [
                [(_token_label(snapshot, int(i)), float(s)) for i, s in zip(ids, scores, strict=True)]
                for ids, scores in zip(m.nearest.ids, m.nearest.scores, strict=True)
            ]
            data[m.name] = {
                token: [[label, round(score, 4)] for label, score in pairs]
                for token, pairs in zip(snapshot.sid_tokens, neighbours, strict=True)
            }
            rows = [
                [
                    Code(snapshot.sid_tokens[i]),
                    "  ".join(f"{json.dumps(t, ensure_ascii=False)} ({s:.2f})" for t, s in neighbours[i]),
                ]
                for i in shown
            ]
            self.blocks += [
                (
                    "p",
                    f"{m.name} ({m.stage or 'no stage'}): top {m.nearest.ids.shape[1]} by cosine similarity",
                ),
                ("table", ["SID token", "nearest vocabulary tokens (cosine)"], rows),
            ]
        if not data:
            self.skip("Nearest vocabulary tokens: no snapshot has vocabulary rows.")
            return
        text = json.dumps(data, ensure_ascii=False, indent=1) + "\n"
        self.nearest_json = atomic_write_text(self.out / "nearest_vocabulary.json", text)
        self.blocks.append(("p", "All SID tokens: nearest_vocabulary.json."))

    def notes(self) -> None:
        notes = [f"{m.name}: {note}" for m in self.metrics for note in m.notes]
        if notes:
            self.blocks += [("h", "Notes"), ("list", notes)]


def _token_label(snapshot: GeometrySnapshot, token_id: int) -> str:
    return snapshot.vocab_tokens[token_id] if snapshot.vocab_tokens is not None else f"#{token_id}"


# A report as a list of blocks, rendered to markdown or HTML.
#
# Blocks: ``("h", text)``, ``("p", text)``, ``("img", path, alt)``, ``("table", header, rows)``,
# ``("list", items)``. Cells and items are plain text; :class:`Code` marks a literal (token strings).

Block = tuple[Any, ...]


@dataclass(frozen=True)
class Code:
    """A cell shown literally (code font, nothing interpreted as markup)."""

    text: str


def _md_cell(cell: Any) -> str:
    if isinstance(cell, Code):
        text = cell.text.replace("\n", "\\n")
        fence = "``" if "`" in text else "`"
        pad = " " if fence == "``" else ""
        return f"{fence}{pad}{text}{pad}{fence}".replace("|", "\\|")
    return str(cell).replace("|", "\\|").replace("\n", " ")


def to_markdown(title: str, blocks: list[Block]) -> str:
    """GitHub-flavoured markdown; images are referenced by their (relative) paths."""
    lines = [f"# {title}", ""]
    for block in blocks:
        kind = block[0]
        if kind == "h":
            lines += [f"## {block[1]}", ""]
        elif kind == "p":
            lines += [block[1], ""]
        elif kind == "img":
            lines += [f"![{block[2]}]({block[1]})", ""]
        elif kind == "list":
            lines += [f"- {_md_cell(item)}" for item in block[1]] + [""]
        elif kind == "table":
            header, rows = block[1], block[2]
            lines.append("| " + " | ".join(_md_cell(c) for c in header) + " |")
            lines.append("|" + "---|" * len(header))
            lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
            lines.append("")
    return "\n".join(lines)


def _html_cell(cell: Any) -> str:
    if isinstance(cell, Code):
        return f"<code>{html.escape(cell.text)}</code>"
    return html.escape(str(cell))


def to_html(title: str, blocks: list[Block]) -> str:
    """A standalone HTML page, everything escaped."""
    body = [f"<h1>{html.escape(title)}</h1>"]
    for block in blocks:
        kind = block[0]
        if kind == "h":
            body.append(f"<h2>{html.escape(block[1])}</h2>")
        elif kind == "p":
            body.append(f"<p>{html.escape(block[1])}</p>")
        elif kind == "img":
            body.append(f'<p><img src="{html.escape(block[1])}" alt="{html.escape(block[2])}"></p>')
        elif kind == "list":
            body.append("<ul>" + "".join(f"<li>{_html_cell(i)}</li>" for i in block[1]) + "</ul>")
        elif kind == "table":
            head = "".join(f"<th>{_html_cell(c)}</th>" for c in block[1])
            rows = "".join(
                "<tr>" + "".join(f"<td>{_html_cell(c)}</td>" for c in r) + "</tr>" for r in block[2]
            )
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
    style = (
        "body{font-family:sans-serif;max-width:1200px;margin:auto}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 6px;font-size:90%}img{max-width:100%}"
    )
    return (
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{style}</style></head>\n<body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
