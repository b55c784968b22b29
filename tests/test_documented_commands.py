"""Every command the documentation shows still parses: each ``peft-grounded ...`` and ``python benchmarks/...py``
invocation in README.md, BENCHMARKS.md and docs/*.md is run with ``--dry-run``, which parses it, builds its
settings (the configs and budgets the run would build) and stops before any work. A change that breaks a
documented command (a flag renamed without an alias, a setting refused only after the long work) fails here.

Placeholders are substituted: an upper-case word (``SIDS``, ``ADAPTER_DIR``, ``REPO_ID``) becomes a path-like
``placeholder-<word>`` (``N``, ``K``, ``M``: a number); a shell variable set in the same code block (``B="..."``)
is expanded, any other (``$seed``) becomes 0; ``[--flag X]`` of a synopsis is taken as given; ``...`` (an
elided part) and prose mentions of a command without arguments are left out.
"""

from __future__ import annotations

import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest

from peft_grounded.cli import main

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]
START = re.compile(r"^(?:python3? (?:-m peft_grounded\.cli|benchmarks/[\w/]+\.py)|peft-grounded)(?:\s|$)")
NUMBERS = {"N": "1", "K": "10", "M": "1", "S": "0.1"}


def _fenced_and_prose(text: str) -> tuple[list[str], str]:
    """(the code blocks, fenced or indented by four spaces; the prose with the fenced blocks removed)."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.M | re.S)
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.M | re.S)
    indented = re.findall(r"(?:^(?: {4}|\t).*\n?)+", prose, flags=re.M)
    return blocks + indented, prose


def _variables(block: str) -> dict[str, str]:
    found = {}
    for name, value in re.findall(r"^\s*([A-Za-z_]\w*)=(\"[^\"]*\"|'[^']*'|\S+)\s*$", block, flags=re.M):
        found[name] = value.strip("\"'")
    return found


def _split(line: str) -> list[str]:
    """Shell-like pieces of ``line`` (comments dropped), split at ``&&``, ``;``, ``|`` and ``>``."""
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError:
        return []
    pieces, current = [], []
    for token in tokens:
        if token in ("&&", ";", "|", "||", ">", ">>", "2>&1") or token.endswith(";"):
            if token.endswith(";") and token != ";":
                current.append(token[:-1])
            pieces.append(current)
            current = []
        else:
            current.append(token)
    pieces.append(current)
    return [" ".join(shlex.quote(t) for t in piece) for piece in pieces if piece]


def _substitute(tokens: list[str], variables: dict[str, str]) -> list[str] | None:
    out: list[str] = []
    for token in tokens:
        if "..." in token or "…" in token:
            return None  # elided: not a whole command
        token = token.strip("[]").split("|")[0]  # a synopsis' [--flag X]; "1|2": one of the choices
        if not token:
            continue
        if token.startswith("$"):
            name = token[1:].strip("{}")
            expanded = _substitute(shlex.split(variables[name]), variables) if name in variables else ["0"]
            if expanded is None:
                return None
            out += expanded
            continue
        if re.fullmatch(r"[A-Z][A-Z0-9_]*", token):
            out.append(NUMBERS.get(token, f"placeholder-{token.lower()}"))
            continue
        out.append(token)
    return out


def documented_commands() -> list[tuple[str, list[str]]]:
    """(where, argv) of every documented invocation; argv starts with ``peft-grounded`` or the script path."""
    found: dict[tuple[str, ...], str] = {}
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        blocks, prose = _fenced_and_prose(text)
        candidates: list[tuple[str, dict[str, str]]] = []
        for block in blocks:
            joined = re.sub(r"\\\n\s*", " ", block)
            variables = _variables(joined)
            candidates += [(line, variables) for line in joined.splitlines()]
        for span in re.findall(r"`([^`]+)`", prose):
            candidates.append((" ".join(span.split()), {}))
        for line, variables in candidates:
            for piece in _split(line):
                tokens = shlex.split(piece)
                while tokens and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", tokens[0]):
                    tokens = tokens[1:]  # OMP_NUM_THREADS=1 ...
                if tokens and tokens[0] in ("accelerate", "torchrun") and "peft_grounded.cli" in tokens:
                    i = tokens.index("peft_grounded.cli")  # accelerate launch ... -m peft_grounded.cli CMD
                    tokens = ["python", "-m", *tokens[i:]]
                if not tokens or not START.match(" ".join(tokens)):
                    continue
                if tokens[:3] == ["python", "-m", "peft_grounded.cli"]:
                    tokens = ["peft-grounded", *tokens[3:]]
                elif tokens[0].startswith("python"):
                    tokens = tokens[1:]
                argv = _substitute(tokens, variables)
                if argv is None or (argv[0] == "peft-grounded" and len(argv) < 3 and "--help" not in argv):
                    continue  # elided, or a mention of a command in prose
                if argv[0] == "peft-grounded" and argv[1].startswith("placeholder-"):
                    continue  # peft-grounded COMMAND --help
                found.setdefault(tuple(argv), f"{doc.name}: {line.strip()[:80]}")
    return [(where, list(argv)) for argv, where in found.items()]


COMMANDS = documented_commands()


def test_the_documents_show_commands():
    assert any(
        where.startswith("distributed.md") for where, _ in COMMANDS
    )  # accelerate launch -m peft_grounded.cli
    scripts = {argv[0] for _, argv in COMMANDS if argv[0] != "peft-grounded"}
    clis = {argv[1] for _, argv in COMMANDS if argv[0] == "peft-grounded"}
    assert len(COMMANDS) > 40 and len(scripts) > 10 and {"build-sids", "sft", "diagnose", "push"} <= clis
    assert any("bench_grow_protocol.py" in argv[0] and "--no-retrained" in argv for _, argv in COMMANDS)


def dry_run(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> int:
    """Run one documented command with ``--dry-run``: 0 when its settings build."""
    if argv[0] == "peft-grounded":
        try:
            return main([*argv[1:], "--dry-run"])
        except SystemExit as stop:  # --help
            return int(stop.code or 0)
    script = ROOT / argv[0]
    assert script.is_file(), f"{argv[0]}: no such script"
    monkeypatch.setattr(sys, "argv", [str(script), *argv[1:], "--dry-run"])
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as stop:
        return 0 if stop.code in (0, None) else (stop.code if isinstance(stop.code, int) else 2)
    return 1  # ran to the end: the script has no --dry-run


@pytest.mark.parametrize(("where", "argv"), COMMANDS, ids=[" ".join(a)[:90] for _, a in COMMANDS])
def test_documented_command_builds_its_settings(where, argv, monkeypatch, capsys):
    assert dry_run(argv, monkeypatch) == 0, f"{where}: {' '.join(argv)}\n{capsys.readouterr().err[-2000:]}"
