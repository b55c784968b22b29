"""``peft-grounded diagnose``: the geometry of the SID rows of saved adapters, as a report (docs/diagnostics.md).

The flags are the fields of :class:`DiagnoseArguments` and :class:`DiagnoseReportArguments`, parsed by TRL's
parser; ``--config FILE.yaml`` gives any of them. Adapter folders may also be given without a flag.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .common import Command, catalogue_field, csv_list


def _fmt(value: float | None) -> str:
    return "n/a" if value is None or value != value else f"{value:.3f}"  # NaN != NaN


@dataclass
class DiagnoseArguments:
    """The adapters (or a runner's folder) to read, the SID index, where the report goes, and its inputs."""

    sid_index: str = field(metadata={"help": "The SID index the adapters were made with."})
    output_dir: str = field(metadata={"help": "Directory of the report."})
    adapters: list[str] = field(
        default_factory=list, metadata={"help": "Saved adapter directories (also given without the flag)."}
    )
    runs: str | None = field(
        default=None, metadata={"help": "Also take every finished stage of a runner's output folder."}
    )
    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Base checkpoint; None: the adapters' base_model_name_or_path."},
    )
    no_vocabulary: bool = field(
        default=False, metadata={"help": "No base-model rows: no text tokens, no nearest."}
    )
    catalogue: str | None = catalogue_field("For categories and target counts. ")
    catalogue_format: Literal["auto", "lcrec", "amazon", "movielens", "recbole", "table"] = field(
        default="auto", metadata={"help": "The catalogue's format (auto: detected)."}
    )
    reference: Literal["items", "codebook", "none"] = field(
        default="items", metadata={"help": "Centroid variant for RSA."}
    )
    matrix: Literal["input", "output"] = field(
        default="input", metadata={"help": "Input rows or untied head rows."}
    )
    frequencies: Literal["auto", "targets", "interactions", "items", "none"] = field(
        default="auto",
        metadata={
            "help": "Code frequency for popularity R^2 (auto: training targets with a catalogue, else "
            "interactions)."
        },
    )
    category_depth: int = field(default=0, metadata={"help": "Category path element used for purity."})
    name: list[str] = field(
        default_factory=list,
        metadata={"help": "Label of each adapter, in order (--name a b, or repeated).", "action": "extend"},
    )
    strategies: list[str] = field(
        default_factory=list, metadata={"help": "--runs: only these strategies (spaces or commas)."}
    )
    stages: list[str] = field(
        default_factory=list, metadata={"help": "--runs: only these stages, e.g. init,sft."}
    )
    seeds: str = field(default="first", metadata={"help": "--runs: first, all, or a list: 0,1."})
    keep_duplicates: bool = field(
        default=False, metadata={"help": "--runs: also show stages whose rows repeat another's."}
    )

    def __post_init__(self) -> None:
        self.adapters = csv_list(self.adapters) if self.adapters else []
        self.seed_choice()
        if not self.adapters and not self.runs:
            raise ValueError(
                "diagnose: give ADAPTER_DIR arguments (or --adapters DIR ...), --runs DIR, or both"
            )
        if self.name and len(self.name) != len(self.adapters):
            raise ValueError(
                f"diagnose: {len(self.name)} --name for {len(self.adapters)} adapters; give one each"
            )

    def seed_choice(self) -> str | list[int]:
        """``--seeds`` as find_run_checkpoints takes it."""
        if self.seeds in ("first", "all"):
            return self.seeds
        try:
            return [int(part) for part in csv_list(self.seeds)]
        except ValueError:
            raise ValueError(f"seeds={self.seeds!r}: give first, all or a list of seeds (0,1)") from None


@dataclass
class DiagnoseReportArguments:
    """What the report shows."""

    _argument_group_name = "report"

    title: str | None = field(default=None, metadata={"help": "Report title."})
    n_text: int = field(default=50, metadata={"help": "Text tokens in the heatmap."})
    n_sid: int = field(default=50, metadata={"help": "SID tokens in the heatmap."})
    purity_m: int = field(default=10, metadata={"help": "Neighbours for purity P_m."})
    r2_q: int = field(default=3, metadata={"help": "Principal components for R^2_q."})
    nearest_k: int = field(default=5, metadata={"help": "Nearest vocabulary tokens per SID token."})
    strict: bool = field(
        default=False, metadata={"help": "Fail when fewer tokens exist than the heatmap asks for."}
    )
    html: bool = field(default=False, metadata={"help": "Also write report.html."})


def run(args: DiagnoseArguments, report: DiagnoseReportArguments) -> int:
    from peft_grounded.diagnostics.diagnose import diagnose
    from peft_grounded.diagnostics.measure import ReportConfig
    from peft_grounded.diagnostics.rows import checkpoint, find_run_checkpoints

    options = {"title": report.title} if report.title else {}
    config = ReportConfig(
        n_text=report.n_text,
        n_sid=report.n_sid,
        purity_m=report.purity_m,
        r2_q=report.r2_q,
        nearest_k=report.nearest_k,
        strict=report.strict,
        html=report.html,
        **options,
    )
    points = [
        checkpoint(path, name)
        for path, name in zip(args.adapters, args.name or [None] * len(args.adapters), strict=True)
    ]
    intro = []
    if args.runs:
        folder = find_run_checkpoints(
            args.runs,
            strategies=csv_list(args.strategies) or None,
            stages=csv_list(args.stages) or None,
            seeds=args.seed_choice(),
        )
        points += folder.checkpoints
        intro = [f"Checkpoints from {args.runs}.", *folder.notes]
    catalogue = args.catalogue  # a path is read as the index's record says and checked against it
    if args.catalogue and args.catalogue_format != "auto":
        from peft_grounded.sids.loaders import load_catalogue

        catalogue = load_catalogue(args.catalogue, format=args.catalogue_format)
    files = diagnose(
        points,
        args.sid_index,
        out_dir=args.output_dir,
        base_model=False if args.no_vocabulary else args.model_name_or_path,
        catalogue=catalogue,
        config=config,
        reference=None if args.reference == "none" else args.reference,
        matrix=args.matrix,
        frequencies=args.frequencies,
        category_depth=args.category_depth,
        drop_duplicates=bool(args.runs) and not args.keep_duplicates,
        intro=intro,
    )
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


COMMAND = Command(
    name="diagnose",
    help="report the geometry of the SID token rows of saved adapters (ranks, RSA, purity, R^2, ...)",
    description="Read the SID rows of saved grounded adapters (or of every stage of a strategy runner's output) "
    "and write a report comparing them: cosine heatmaps, singular-value spectra and effective rank, RSA "
    "against the SID index's centroids, neighbourhood purity, popularity R^2 and the nearest vocabulary tokens.",
    settings=lambda: (DiagnoseArguments, DiagnoseReportArguments),
    run=run,
    positionals=(("adapters", "*"),),
)
