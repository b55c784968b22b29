#!/usr/bin/env bash
# Prepare, on this machine, everything the GPU machine lacks (see benchmarks/gpu/README.md):
#   .whl/                          trl, datasets (+ dill, multiprocess), gguf, peft: wheels for Python 3.12
#   .gpu_transfer/part1/           the SmolLM2 GGUF's first part (sent alone, by the preparatory command)
#   .gpu_transfer/payload/         its second part + sha256 manifest, ML-100K and Office, their SID indexes
# Both folders are git-ignored and travel with `run`'s carry. Prints the sizes of what each command sends.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && PY=.venv/bin/python
WHEELS=(trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 gguf==0.19.0 peft==0.21.2)
mkdir -p .whl
if [ "$(ls .whl/*.whl 2>/dev/null | wc -l)" -lt "${#WHEELS[@]}" ]; then
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${WHEELS[@]}"
fi
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
  "$PY" benchmarks/gpu/gpu_run.py prepare --payload .gpu_transfer "$@"
tree_mib=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
part1=$(du -cb .gpu_transfer/part1 | tail -1 | cut -f1)
payload=$(du -cb .gpu_transfer/payload .whl | tail -1 | cut -f1)
awk -v t="$tree_mib" -v a="$part1" -v b="$payload" 'BEGIN {
  printf "tracked tree %.1f MiB\npreparatory command: %.1f MiB (tree + part1)\nrun command: %.1f MiB (tree + payload + wheels)\nlimit: 64 MiB each (untracked, not ignored files count too)\n", t/2^20, (t+a)/2^20, (t+b)/2^20 }'
