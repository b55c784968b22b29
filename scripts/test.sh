#!/usr/bin/env bash
# Set up the environment and run the test suite (offline). Extra arguments go to pytest,
# e.g. `bash scripts/test.sh -m "not slow"` for the quick subset.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
ruff check peft_grounded tests examples benchmarks
python -m pytest -q "$@"
