"""PEFT's own common test matrix (``PeftCommonTester``) run for TrainableTokens and for this adapter, side by side.

    python benchmarks/peft_common_matrix.py --peft_tests /work/peft-tests-0.21.2/tests
    python benchmarks/peft_common_matrix.py --peft_tests DIR -k merge --out runs/peft_matrix

``--peft_tests`` is the ``tests/`` folder of PEFT's repository at the installed version (``testing_common.py``,
``testing_utils.py``, ``test_custom_models.py``; PEFT's PyPI sdist ships it, without the empty ``__init__.py``).
Nothing of it is copied into this project: the script copies the folder to a temporary directory as the package
``peft_common_tests`` and runs its ``TestPeftCustomModel`` tests with pytest, in this process, offline.

The matrix is every test of ``test_custom_models.py`` parametrised over ``TEST_CASES`` (merge, safe merge,
unload, save/load, disable and delete adapters, dtypes, ...), on the small models PEFT runs TrainableTokens on.
``TEST_CASES`` is narrowed to the rows of ``COLUMNS``: PEFT's own TrainableTokens entry (``ModelEmbConv1D``, a
100 x 5 embedding, tokens 0, 1, 3, ``init_weights=False``) and the same on PEFT's ``ModelEmbWithEmbeddingUtils``
(``get_input_embeddings`` as transformers models have; added to the file's ``MockTransformerWrapper``) and on
tokens 7, 8, 9, each beside ``GroundedTokenConfig`` on the same model and tokens. PEFT sets ``init_weights`` as
it does for every method: ``set_init_weights_false`` in the tests that need an adapter that changes the output,
the entry as it is in the others. The grounded entries pin ``init="keep"``, so that their default
``init_weights=True`` is the no-op start TrainableTokens' is (see ``COLUMNS``).

The table gives each test's outcome per column (PASS, FAIL, ERROR, SKIP) and, last, the tests that fail for
this adapter where TrainableTokens passes on the same model and tokens, with the first line of the error. ``--out DIR`` also writes
``matrix.md`` and ``matrix.json``. The exit status is 1 when there is such a test, else 0.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import types
from dataclasses import dataclass, field
from pathlib import Path

try:
    from benchmarks._args import parse
except ModuleNotFoundError:  # run as a file: its folder is on sys.path, not the repository
    from _args import parse


@dataclass
class Settings:
    peft_tests: str = field(metadata={"help": "PEFT's tests/ folder at the installed version"})
    k: str | None = field(
        default=None, metadata={"help": "pytest -k expression to run part of the matrix", "aliases": ["-k"]}
    )
    out: str | None = field(default=None, metadata={"help": "folder for matrix.md and matrix.json"})
    verbose: bool = field(default=False, metadata={"help": "pytest's own output too"})


PACKAGE = "peft_common_tests"
MATRIX_PARAMS = ("test_name", "model_id", "config_cls", "config_kwargs")
TT_ENTRY = "Embedding + transformers Conv1D 1 trainable_tokens"  # PEFT's own TrainableTokens case


@dataclass(frozen=True)
class Column:
    """One ``TEST_CASES`` row of the run: a method's config on one of PEFT's small models."""

    name: str  # the row's test_name, the table's column
    model_id: str
    grounded: bool  # GroundedTokenConfig, else TrainableTokensConfig
    kwargs: dict | None  # None: PEFT's own TrainableTokens entry
    versus: str | None = None  # grounded columns: the TrainableTokens column they must match
    strict: bool = True  # a miss where TrainableTokens passes counts (exit status 1)
    note: str = ""


# The grounded entries pin init="keep", so that their init_weights=True (the default) is the no-op start that
# TrainableTokens' init_weights=True is: PEFT's identity-at-init tests (test_disable_adapters) take the entry as it
# is, and the tests that want a non-identity adapter apply set_init_weights_false, which sets init_weights=False
# (random rows, for both methods). task_type=None: PEFT's default, which TrainableTokens has (these models are no
# LMs; GroundedTokenConfig defaults to CAUSAL_LM). The merge tests compare the first input row, the ids 0..9.
_GROUNDED = {"init": "keep", "task_type": None}
COLUMNS = (
    Column("TrainableTokens EmbConv1D [0,1,3]", "EmbConv1D", False, None),
    Column(
        "grounded EmbConv1D [0,1,3]",
        "EmbConv1D",
        True,
        {"target_modules": ["emb"], "token_indices": [0, 1, 3], "tokens_are_new": False, **_GROUNDED},
        versus="TrainableTokens EmbConv1D [0,1,3]",
    ),
    Column(
        "grounded EmbConv1D [0,1,3], init_weights=False in the entry",
        "EmbConv1D",
        True,
        {
            "target_modules": ["emb"],
            "token_indices": [0, 1, 3],
            "tokens_are_new": False,
            "init_weights": False,
            **_GROUNDED,
        },
        versus="TrainableTokens EmbConv1D [0,1,3]",
        strict=False,
        note="the entry written as TrainableTokens' is; test_disable_adapters* set init_weights=True back for "
        "TrainableTokensConfig only (an isinstance check), so this entry's adapter is random there",
    ),
    Column(
        "grounded EmbConv1D [0,1,3], default init (mean)",
        "EmbConv1D",
        True,
        {"target_modules": ["emb"], "token_indices": [0, 1, 3], "tokens_are_new": False, "task_type": None},
        versus="TrainableTokens EmbConv1D [0,1,3]",
        strict=False,
        note="the package's default start, which moves the rows by design: no identity at init",
    ),
    Column(
        "TrainableTokens EmbWithEmbeddingUtils [0,1,3]",
        "EmbWithEmbeddingUtils",
        False,
        {"target_modules": ["embed_tokens"], "token_indices": [0, 1, 3], "init_weights": False},
    ),
    Column(
        "grounded EmbWithEmbeddingUtils [0,1,3]",
        "EmbWithEmbeddingUtils",
        True,
        {
            "target_modules": ["embed_tokens"],
            "token_indices": [0, 1, 3],
            "tokens_are_new": False,
            **_GROUNDED,
        },
        versus="TrainableTokens EmbWithEmbeddingUtils [0,1,3]",
    ),
    Column(
        "TrainableTokens EmbConv1D [7,8,9]",
        "EmbConv1D",
        False,
        {"target_modules": ["emb"], "token_indices": [7, 8, 9], "init_weights": False},
    ),
    Column(
        "grounded EmbConv1D new [7,8,9]",
        "EmbConv1D",
        True,
        {"target_modules": ["emb"], "token_indices": [7, 8, 9], **_GROUNDED},
        versus="TrainableTokens EmbConv1D [7,8,9]",
        note="new tokens: tokens_are_new (the default), original_vocab_size 7",
    ),
)
# PEFT's model classes that its MockTransformerWrapper does not build
EXTRA_MODELS = {"EmbWithEmbeddingUtils": "ModelEmbWithEmbeddingUtils"}


def matrix_cases(test_cases: list) -> list[tuple]:
    """The ``TEST_CASES`` rows of the run: PEFT's TrainableTokens entry and the other columns."""
    from peft import TrainableTokensConfig

    from peft_grounded import GroundedTokenConfig

    entry = next(row for row in test_cases if row[0] == TT_ENTRY)
    return [
        (
            c.name,
            c.model_id,
            GroundedTokenConfig if c.grounded else TrainableTokensConfig,
            dict(entry[3]) if c.kwargs is None else dict(c.kwargs),
        )
        for c in COLUMNS
    ]


class MatrixPlugin:
    """Narrows ``TEST_CASES`` before collection, keeps the tests parametrised over it, records the outcomes."""

    def __init__(self) -> None:
        self.items: dict[str, tuple[str, str]] = {}  # nodeid -> (test, case name)
        self.outcomes: dict[str, str] = {}
        self.messages: dict[str, str] = {}

    def pytest_sessionstart(self, session) -> None:
        import importlib

        import torch

        module = importlib.import_module(f"{PACKAGE}.test_custom_models")
        # the parametrize marks hold this very list: narrowing it in place narrows the matrix
        module.TEST_CASES[:] = matrix_cases(list(module.TEST_CASES))
        mock = module.MockTransformerWrapper
        original = mock.from_pretrained.__func__

        def from_pretrained(cls, model_id, dtype=None):
            if model_id not in EXTRA_MODELS:
                return original(cls, model_id, dtype=dtype)
            torch.manual_seed(0)  # as the mock does: the same model on every call
            return getattr(module, EXTRA_MODELS[model_id])().to(dtype or torch.float32)

        mock.from_pretrained = classmethod(from_pretrained)

    def pytest_collection_modifyitems(self, session, config, items) -> None:
        keep, drop = [], []
        for item in items:
            params = getattr(getattr(item, "callspec", None), "params", {})
            if not all(p in params for p in MATRIX_PARAMS):
                drop.append(item)
                continue
            others = [f"{k}={_short(v)}" for k, v in params.items() if k not in MATRIX_PARAMS]
            test = item.originalname + (f"[{', '.join(others)}]" if others else "")
            self.items[item.nodeid] = (test, params["test_name"])
            keep.append(item)
        items[:] = keep
        config.hook.pytest_deselected(items=drop)

    def pytest_runtest_logreport(self, report) -> None:
        if report.nodeid not in self.items:
            return
        if report.failed:
            outcome = "FAIL" if report.when == "call" else "ERROR"
            self.outcomes[report.nodeid] = outcome
            self.messages[report.nodeid] = _first_line(report)
        elif report.skipped:
            self.outcomes.setdefault(report.nodeid, "SKIP")
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            self.messages.setdefault(report.nodeid, reason.removeprefix("Skipped: "))
        elif report.when == "call":
            self.outcomes[report.nodeid] = "PASS"

    def table(self) -> dict[str, dict[str, dict[str, str]]]:
        """``{test: {case name: {"outcome": ..., "message": ...}}}``."""
        out: dict[str, dict[str, dict[str, str]]] = {}
        for nodeid, (test, case) in self.items.items():
            out.setdefault(test, {})[case] = {
                "outcome": self.outcomes.get(nodeid, "NOT RUN"),
                "message": self.messages.get(nodeid, ""),
            }
        return out


def _short(value) -> str:
    return str(value).removeprefix("torch.")


def _first_line(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    return text.strip().splitlines()[0][:200] if text.strip() else ""


def regressions(table: dict, strict: bool = True) -> list[tuple[str, str, str]]:
    """``(test, column, message)`` where a grounded column fails and its TrainableTokens column passes."""
    out = []
    for test, row in table.items():
        for c in COLUMNS:
            if c.versus is None or c.strict != strict:
                continue
            ours, theirs = row.get(c.name, {}), row.get(c.versus, {})
            if theirs.get("outcome") == "PASS" and ours.get("outcome") != "PASS":
                out.append((test, c.name, f"{ours.get('outcome')}: {ours.get('message', '')}"))
    return out


def markdown(table: dict) -> str:
    lines = ["Columns:"]
    for i, c in enumerate(COLUMNS, 1):
        kwargs = "PEFT's TrainableTokens entry" if c.kwargs is None else json.dumps(c.kwargs)
        lines.append(f"{i}. {c.name} ({c.model_id}): {kwargs}" + (f"; {c.note}" if c.note else ""))
    lines += ["", "| test | " + " | ".join(str(i) for i in range(1, len(COLUMNS) + 1)) + " |"]
    lines.append("|---" * (len(COLUMNS) + 1) + "|")
    for test in sorted(table):
        cells = [table[test].get(c.name, {}).get("outcome", "-") for c in COLUMNS]
        lines.append(f"| {test} | " + " | ".join(cells) + " |")
    counts = []
    for c in COLUMNS:
        outcomes = [table[t].get(c.name, {}).get("outcome") for t in table]
        counts.append(f"{outcomes.count('PASS')}/{sum(o is not None for o in outcomes)}")
    lines.append("| **pass** | " + " | ".join(counts) + " |")
    lost = regressions(table)
    lines += ["", f"Fails for the grounded adapter where TrainableTokens passes: {len(lost)}"]
    lines += [f"- {test} [{name}]: {message}" for test, name, message in lost]
    known = regressions(table, strict=False)
    if known:
        lines += ["", f"In the informative columns (not counted): {len(known)}"]
        lines += [f"- {test} [{name}]: {message}" for test, name, message in known]
    return "\n".join(lines)


def _stage(peft_tests: Path, into: Path) -> Path:
    """Copy PEFT's tests to ``into/peft_common_tests`` (a package: their imports are relative)."""
    package = into / PACKAGE
    shutil.copytree(peft_tests, package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (package / "__init__.py").touch()
    (into / "pytest.ini").write_text("[pytest]\n")  # none of this project's pytest settings
    return package


def _stub_diffusers() -> None:
    """``testing_common`` imports ``diffusers`` for its Stable Diffusion tests, which the matrix does not run."""
    try:
        import diffusers  # noqa: F401
    except ImportError:
        stub = types.ModuleType("diffusers")
        stub.StableDiffusionPipeline = type("StableDiffusionPipeline", (), {})
        sys.modules["diffusers"] = stub


def _check_folder(folder: Path) -> None:
    needed = ("testing_common.py", "testing_utils.py", "test_custom_models.py")
    missing = [f for f in needed if not (folder / f).is_file()]
    if missing:
        raise SystemExit(
            f"--peft_tests {folder}: no {', '.join(missing)} (PEFT's tests/ folder, its version's)"
        )


def parse_args(argv: list[str] | None = None) -> Settings:
    return parse(Settings, argv, prog="peft_common_matrix.py", description=__doc__)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _check_folder(Path(args.peft_tests))  # after --dry-run: the docs name the folder by a placeholder

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import peft
    import pytest

    import peft_grounded  # registers GROUNDED_TOKENS with PEFT

    _stub_diffusers()
    with tempfile.TemporaryDirectory(prefix="peft_matrix_") as tmp:
        package = _stage(Path(args.peft_tests), Path(tmp))
        sys.path.insert(0, tmp)
        plugin = MatrixPlugin()
        pytest_args = [
            str(package / "test_custom_models.py"),
            "-c",
            str(Path(tmp) / "pytest.ini"),
            "--rootdir",
            tmp,
            "-p",
            "no:cacheprovider",
            "-W",
            "ignore::DeprecationWarning",
        ]
        pytest_args += ["-q", "--tb=line"] if args.verbose else ["-p", "no:terminal"]
        if args.k:
            pytest_args += ["-k", args.k]
        status = pytest.main(pytest_args, plugins=[plugin])
        sys.path.remove(tmp)
    table = plugin.table()
    if not table:
        raise SystemExit(f"pytest ran none of the matrix (exit status {int(status)}); rerun with --verbose")
    text = (
        f"PEFT {peft.__version__}, peft_grounded {getattr(peft_grounded, '__version__', '?')}, "
        f"tests from {Path(args.peft_tests).resolve()}\n\n" + markdown(table)
    )
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "matrix.md").write_text(text + "\n")
        (out / "matrix.json").write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    return 1 if regressions(table) else 0


if __name__ == "__main__":
    sys.exit(main())
