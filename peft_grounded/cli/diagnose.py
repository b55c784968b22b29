"""``peft-grounded diagnose``: the geometry of the SID rows of saved adapters, as a report (docs/diagnostics.md)."""

from __future__ import annotations

import argparse
from typing import Any

from .common import add_output_dir


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _seeds(text: str) -> str | list[int]:
    if text in ("first", "all"):
        return text
    try:
        return [int(part) for part in _csv(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not 'first', 'all' or a list of seeds (0,1)") from None


def _fmt(value: float | None) -> str:
    return "n/a" if value is None or value != value else f"{value:.3f}"  # NaN != NaN


def add_cli(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "diagnose",
        help="report the geometry of the SID token rows of saved adapters (ranks, RSA, purity, R^2, ...)",
        description="Read the SID rows of saved grounded adapters (or of every stage of a strategy runner's "
        "output) and write a report comparing them: cosine heatmaps, singular-value spectra and effective "
        "rank, RSA against the SID index's centroids, neighbourhood purity, popularity R^2 and the nearest "
        "vocabulary tokens.",
    )
    p.add_argument("adapters", nargs="*", metavar="ADAPTER_DIR", help="saved adapter directories")
    p.add_argument("--runs", metavar="DIR", help="also take every finished stage of a runner's output folder")
    p.add_argument(
        "--sid-index", required=True, metavar="DIR", help="the SID index the adapters were made with"
    )
    add_output_dir(p, "directory of the report", old=("--out", "-o"), required=True, metavar="DIR")
    g = p.add_argument_group("inputs")
    g.add_argument("--base-model", help="base checkpoint (default: the adapters' base_model_name_or_path)")
    g.add_argument(
        "--no-vocabulary", action="store_true", help="no base-model rows: no text tokens, no nearest"
    )
    g.add_argument("--catalogue", help="catalogue path (or movielens-100k) for categories and target counts")
    g.add_argument("--catalogue-format", default="auto", help="its format (default: detected)")
    g.add_argument(
        "--reference", default="items", help="centroid variant for RSA: items (default), codebook, none"
    )
    g.add_argument(
        "--matrix", default="input", choices=["input", "output"], help="input rows or untied head rows"
    )
    g.add_argument(
        "--frequencies",
        default="auto",
        choices=["auto", "targets", "interactions", "items", "none"],
        help="code frequency for popularity R^2 (auto: training targets with a catalogue, else interactions)",
    )
    g.add_argument("--category-depth", type=int, default=0, help="category path element used for purity")
    g.add_argument("--name", action="append", help="label of each ADAPTER_DIR, in order (repeat)")
    g = p.add_argument_group("runner folder (--runs)")
    g.add_argument("--strategies", type=_csv, help="only these strategies (comma-separated)")
    g.add_argument("--stages", type=_csv, help="only these stages, e.g. init,sft")
    g.add_argument("--seeds", type=_seeds, default="first", help="first (default), all, or a list: 0,1")
    g.add_argument(
        "--keep-duplicates", action="store_true", help="also show stages whose rows repeat another's"
    )
    g = p.add_argument_group("report")
    g.add_argument("--title", help="report title")
    g.add_argument("--n-text", type=int, default=50, help="text tokens in the heatmap")
    g.add_argument("--n-sid", type=int, default=50, help="SID tokens in the heatmap")
    g.add_argument("--purity-m", type=int, default=10, help="neighbours for purity P_m")
    g.add_argument("--r2-q", type=int, default=3, help="principal components for R^2_q")
    g.add_argument("--nearest-k", type=int, default=5, help="nearest vocabulary tokens per SID token")
    g.add_argument(
        "--strict", action="store_true", help="fail when fewer tokens exist than the heatmap asks for"
    )
    g.add_argument("--html", action="store_true", help="also write report.html")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import sys

    from peft_grounded.diagnostics.checkpoints import checkpoint, find_run_checkpoints
    from peft_grounded.diagnostics.diagnose import diagnose
    from peft_grounded.diagnostics.measure import ReportConfig

    if not args.adapters and not args.runs:
        print("error: give ADAPTER_DIR arguments, --runs DIR, or both", file=sys.stderr)
        return 2
    if args.name and len(args.name) != len(args.adapters):
        print(f"error: {len(args.name)} --name for {len(args.adapters)} ADAPTER_DIR", file=sys.stderr)
        return 2
    options = {"title": args.title} if args.title else {}
    config = ReportConfig(
        n_text=args.n_text,
        n_sid=args.n_sid,
        purity_m=args.purity_m,
        r2_q=args.r2_q,
        nearest_k=args.nearest_k,
        strict=args.strict,
        html=args.html,
        **options,
    )
    try:
        points = [
            checkpoint(path, name)
            for path, name in zip(args.adapters, args.name or [None] * len(args.adapters), strict=True)
        ]
        intro = []
        if args.runs:
            folder = find_run_checkpoints(
                args.runs, strategies=args.strategies, stages=args.stages, seeds=args.seeds
            )
            points += folder.checkpoints
            intro = [f"Checkpoints from {args.runs}.", *folder.notes]
        catalogue = None
        if args.catalogue:
            from peft_grounded.sids.loaders import load_catalogue

            catalogue = load_catalogue(args.catalogue, format=args.catalogue_format)
        files = diagnose(
            points,
            args.sid_index,
            out_dir=args.output_dir,
            base_model=False if args.no_vocabulary else args.base_model,
            catalogue=catalogue,
            config=config,
            reference=None if args.reference == "none" else args.reference,
            matrix=args.matrix,
            frequencies=args.frequencies,
            category_depth=args.category_depth,
            drop_duplicates=bool(args.runs) and not args.keep_duplicates,
            intro=intro,
        )
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for m in files.metrics:
        rsa, purity = _fmt(m.rsa.pearson if m.rsa else None), _fmt(m.purity.purity if m.purity else None)
        print(
            f"{m.name:32s} eff.rank {m.spectrum.effective_rank:7.2f} (centred {m.spectrum_centred.effective_rank:7.2f})"
            f"  RSA {rsa:>6s}  P_m {purity:>6s}"
        )
    for reason in files.skipped:
        print(f"skipped: {reason}")
    print(f"report: {files.markdown}")
    return 0
