"""A shallower base: the first ``layers`` decoder blocks of a causal LM, saved as a model of its own.

Next-item SFT on a CPU is bound by the forward and backward passes through the frozen backbone; keeping
the first blocks (with the embeddings, final norm and head) divides a step's time by about
``total / layers`` while the SID rows and the LoRA still start from the pretrained model. The result is a
plain transformers checkpoint (safetensors), so every stage, saved adapter and Hub card records it as the
base like any other model.
"""

from __future__ import annotations

from pathlib import Path

from .._io import make_temp_dir


def shallow_base(model_path: str | Path, layers: int, output_dir: str | Path) -> Path:
    """Write (once; atomically) the first ``layers`` decoder blocks of ``model_path`` to ``output_dir``."""
    import shutil

    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(output_dir)
    if (out / "config.json").is_file():
        from transformers import AutoConfig

        have = AutoConfig.from_pretrained(out).get_text_config().num_hidden_layers
        if have != layers:
            raise ValueError(f"{out} holds a {have}-block base, not {layers}: choose another directory")
        return out
    model = AutoModelForCausalLM.from_pretrained(model_path, use_safetensors=True)
    config = model.config.get_text_config()
    if not 1 <= layers <= config.num_hidden_layers:
        raise ValueError(
            f"layers={layers}: the base has {config.num_hidden_layers} decoder blocks; keep 1 to all"
        )
    backbone = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    backbone.layers = backbone.layers[:layers]
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:layers]
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = make_temp_dir(out)
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
