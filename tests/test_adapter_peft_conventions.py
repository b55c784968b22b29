"""Four conventions every PEFT method keeps (PEFT checks them in its common tester), checked here on our own:

(a) ``get_base_model_state_dict`` gives the base's own keys (``lm_head.weight``), so ``set_base_model_state_dict``
    restores an untied head; (b) ``PeftModel.from_pretrained(..., config=config)`` keeps ``config`` itself;
(c) a broken adapter's merge is refused in PEFT's words (``NaNs detected in the merged weights``), leaving the
    base as it was; (d) the adapter starts as a no-op by default (PEFT's ``init_weights=True``, ``init="keep"``):
    the output is the base's. PEFT's ``init_weights=False`` draws random rows instead, as TrainableTokens'
    (tests/test_adapter_peft_matrix.py).

Tiny Llama (tied, untied) and Qwen3 (padded embedding) models; one config still wraps two models.
"""

from __future__ import annotations

import re

import pytest
import torch
from peft import PeftModel, get_base_model_state_dict, get_peft_model, set_base_model_state_dict

import peft_grounded
from peft_grounded import GroundedTokenConfig

CASES = [("llama", True), ("llama", False), ("qwen3", False)]
IDS = ["llama-tied", "llama-untied", "qwen3-untied"]


def base_with_tokens(tokenizer, factory, arch, tied, seed=0):
    """A tiny base with 8 SID tokens added (Qwen3: rows padded beyond the tokenizer, as its checkpoints are)."""
    from transformers import AutoTokenizer

    model = factory(arch, tied, extra_rows=64 if arch == "qwen3" else 0, seed=seed)
    fresh = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    return model, peft_grounded.add_sid_tokens(fresh, model, [4, 4])


def logits(model, new) -> torch.Tensor:
    ids = torch.tensor([[1, 17, new[0], 400, new[5], new[7], 9]])
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.parametrize(("arch", "tied"), CASES, ids=IDS)
def test_base_state_dict_has_the_base_keys_and_restores_the_head(tokenizer, tiny_model_factory, arch, tied):
    base, new = base_with_tokens(tokenizer, tiny_model_factory, arch, tied)
    before = {k: v.clone() for k, v in base.state_dict().items()}
    model = get_peft_model(base, GroundedTokenConfig(token_indices=new, init="gaussian"))

    state = get_base_model_state_dict(model)
    assert set(state) == set(before) and "lm_head.weight" in state
    assert not [k for k in state if "base_layer" in k or "grounded_" in k]
    assert all(torch.equal(state[k], before[k]) for k in before)  # the frozen base, not the adapter rows

    head = model.get_output_embeddings().base_layer.weight
    with torch.no_grad():
        head.zero_()  # tied: the embedding's rows too
    result = set_base_model_state_dict(model, {"lm_head.weight": before["lm_head.weight"]}, strict=False)
    assert result.unexpected_keys == [] and "lm_head.weight" not in result.missing_keys
    assert torch.equal(head, before["lm_head.weight"])
    set_base_model_state_dict(model, before)  # strict: every key found, none left over
    assert all(torch.equal(t, before[k]) for k, t in get_base_model_state_dict(model).items())


@pytest.mark.parametrize(("arch", "tied"), CASES, ids=IDS)
def test_from_pretrained_keeps_the_given_config(tokenizer, tiny_model_factory, arch, tied, tmp_path):
    base, new = base_with_tokens(tokenizer, tiny_model_factory, arch, tied)
    config = GroundedTokenConfig(token_indices=new, init="gaussian", init_seed=3)
    model = get_peft_model(base, config)
    expected = logits(model, new)
    model.save_pretrained(tmp_path)

    again, _ = base_with_tokens(tokenizer, tiny_model_factory, arch, tied)
    loaded = PeftModel.from_pretrained(again, tmp_path, is_trainable=False, config=config)
    assert loaded.peft_config["default"] is config and config.inference_mode
    torch.testing.assert_close(logits(loaded, new), expected, rtol=0, atol=0)

    other, _ = base_with_tokens(tokenizer, tiny_model_factory, arch, tied, seed=1)
    elsewhere = get_peft_model(other, config)  # the same config on another base: a copy of its own
    assert elsewhere.peft_config["default"] is not config
    assert (
        config.provenance.embedding_signature
        != elsewhere.peft_config["default"].provenance.embedding_signature
    )


@pytest.mark.parametrize(("arch", "tied"), CASES, ids=IDS)
def test_a_nan_adapter_is_not_merged_in_pefts_words(tokenizer, tiny_model_factory, arch, tied):
    base, new = base_with_tokens(tokenizer, tiny_model_factory, arch, tied)
    before = {k: v.clone() for k, v in base.state_dict().items()}
    model = get_peft_model(base, GroundedTokenConfig(token_indices=new, init="gaussian"))
    layer = model.get_input_embeddings()
    rows = layer.grounded_embedding["default"] if tied else layer.grounded_head["default"]
    with torch.no_grad():
        rows[2, 5] = float("nan")  # untied: only the head rows are broken, the input rows would merge

    pattern = re.escape("NaNs detected in the merged weights. The adapter default seems to be broken")
    with pytest.raises(ValueError, match=pattern):
        model.merge_adapter(safe_merge=True)
    with pytest.raises(ValueError, match=pattern):
        model.merge_and_unload(safe_merge=True)
    assert not layer.merged
    assert all(torch.equal(t, before[k]) for k, t in get_base_model_state_dict(model).items())


@pytest.mark.parametrize(("arch", "tied"), CASES, ids=IDS)
def test_the_default_start_is_a_no_op(tokenizer, tiny_model_factory, arch, tied):
    base, new = base_with_tokens(tokenizer, tiny_model_factory, arch, tied)
    expected = logits(base, new)
    model = get_peft_model(base, GroundedTokenConfig(token_indices=new))  # init_weights=True, init not given
    # the same numbers up to the kernels' rounding: the adapter computes the new rows' logits apart from the
    # rest of the head (AVX2 kernels: up to 1.2e-10 absolute, 9e-7 relative, on the new columns)
    torch.testing.assert_close(logits(model, new), expected, rtol=1e-5, atol=1e-8)
    assert any(p.requires_grad for p in model.parameters())  # the rows still train

    def moved_rows():
        """The same base with other rows than add_tokens' mean at the new tokens."""
        started, new2 = base_with_tokens(tokenizer, tiny_model_factory, arch, tied)
        generator = torch.Generator().manual_seed(3)
        with torch.no_grad():
            matrices = (started.get_input_embeddings().weight, started.get_output_embeddings().weight)
            for weight in {id(w): w for w in matrices}.values():
                weight[new2] = torch.randn(len(new2), weight.shape[1], generator=generator)
        return started, new2

    started, new2 = moved_rows()
    moved = logits(started, new2)
    assert not torch.allclose(moved, expected, rtol=1e-3, atol=1e-3)
    held = started.get_input_embeddings().weight[new2].clone()
    kept = get_peft_model(started, GroundedTokenConfig(token_indices=new2))  # keeps whatever the rows hold
    assert torch.equal(kept.get_input_embeddings().grounded_embedding["default"], held)
    torch.testing.assert_close(logits(kept, new2), moved, rtol=1e-4, atol=1e-5)  # larger rows: more rounding
    started, new2 = moved_rows()
    grounded = get_peft_model(started, GroundedTokenConfig(token_indices=new2, init="mean"))  # rewrites them
    torch.testing.assert_close(logits(grounded, new2), expected, rtol=1e-5, atol=1e-6)  # back at the mean
