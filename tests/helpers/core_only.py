"""What the core install must do, as a script: ``get_peft_model`` with ``GroundedTokenConfig`` on a tiny
Llama built from a config, a backward pass, save, load onto a fresh base, merge; then no extra's package and
no harness module is imported. Run by tests/test_core_install.py, in this environment with the extras'
packages hidden (``--hide-extras``) and in a fresh virtual environment with the core alone (where they must
not even be installed: ``--check-not-installed``). Prints ``core-only: ok`` last."""

from __future__ import annotations

import importlib.util
import sys
import tempfile

EXTRAS = ("matplotlib", "gguf", "sentence_transformers", "scipy")
HARNESS = ("peft_grounded.pipeline", "peft_grounded.diagnostics", "peft_grounded.evaluation.peers")


def main(argv: list[str]) -> None:
    if "--hide-extras" in argv:
        for name in EXTRAS:
            sys.modules[name] = None  # import raises, find_spec answers None: as if not installed
    if "--check-not-installed" in argv:
        installed = [name for name in EXTRAS if importlib.util.find_spec(name) is not None]
        assert not installed, f"the core install brought {installed}"

    import torch
    from peft import PeftModel, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from peft_grounded import GroundedTokenConfig

    config = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    torch.manual_seed(0)
    base = LlamaForCausalLM(config)
    base.resize_token_embeddings(136)  # 8 new tokens
    work = tempfile.mkdtemp()
    base.save_pretrained(f"{work}/base")
    model = get_peft_model(base, GroundedTokenConfig(token_indices=list(range(128, 136)), init="mean"))
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable, "no trainable rows"
    ids = torch.tensor([[1, 130, 5, 135]])
    model(input_ids=ids, labels=ids).loss.backward()
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(0.5)  # a trained adapter: rows that differ from the base's
        expected = model(input_ids=ids).logits
    model.save_pretrained(f"{work}/adapter")

    fresh = LlamaForCausalLM.from_pretrained(f"{work}/base")
    loaded = PeftModel.from_pretrained(fresh, f"{work}/adapter")
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, expected, atol=1e-5), "loaded logits differ"
        merged = loaded.merge_and_unload()
        assert isinstance(merged, LlamaForCausalLM), type(merged)
        assert torch.allclose(merged(input_ids=ids).logits, expected, atol=1e-5), "merged logits differ"

    extras = sorted(n for n in EXTRAS if sys.modules.get(n) is not None)
    harness = sorted(m for m in sys.modules if m.startswith(HARNESS))
    assert not extras and not harness, f"the core imported {extras + harness}"
    print("core-only: ok")


if __name__ == "__main__":
    main(sys.argv[1:])
