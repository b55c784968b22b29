"""Encoder-decoder models (T5, BART): every module on the shared embedding weight uses the adapter's rows."""

from __future__ import annotations

import copy

import pytest
import torch
from peft import PeftModel, get_peft_model
from peft.tuners.lora import LoraLayer
from torch import nn

import peft_grounded
from peft_grounded import GroundedTokenConfig
from peft_grounded.adapter import GroundedHead, GroundedTiedEmbedding, GroundedTokenLayer
from peft_grounded.sids.extended_base import record_sid_facts, sid_record

# transformers 5 always ties T5's head (T5Config forces tie_word_embeddings=True); BART can be untied
CASES = [("t5", True), ("bart", True), ("bart", False)]


def build_seq2seq(arch: str, tied: bool = True, seed: int = 0):
    """A 2-layer, 64-wide T5 or BART with the tokenizer's vocabulary."""
    from transformers import AutoModelForSeq2SeqLM, BartConfig, T5Config

    if arch == "t5":
        config = T5Config(
            vocab_size=49152,
            d_model=64,
            d_kv=16,
            d_ff=128,
            num_layers=2,
            num_heads=4,
            decoder_start_token_id=0,
            pad_token_id=0,
            eos_token_id=1,
        )
    else:
        config = BartConfig(
            vocab_size=49152,
            d_model=64,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=128,
            decoder_ffn_dim=128,
            max_position_embeddings=64,
            scale_embedding=True,  # the embedding modules multiply by sqrt(d): the rows must be scaled too
            tie_word_embeddings=tied,
        )
    torch.manual_seed(seed)
    return AutoModelForSeq2SeqLM.from_config(config).eval()


def with_tokens(tokenizer, arch, tied):
    model = build_seq2seq(arch, tied)
    new = peft_grounded.add_sid_tokens(tokenizer, model, [8, 8])
    return model, new


def adapted(tokenizer, arch, tied):
    """The adapter model (rows moved away from their start) and a deep copy of the resized base."""
    base, new = with_tokens(tokenizer, arch, tied)
    reference = copy.deepcopy(base)
    config = GroundedTokenConfig(token_indices=new, init="gaussian", task_type="SEQ_2_SEQ_LM")
    model = get_peft_model(base, config)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p))
    return model, reference, new


def rows_copied_in(reference, model):
    """``reference`` with the adapter rows written into its (shared) embedding and its head."""
    layer = model.get_input_embeddings()
    index = layer.grounded_indices["default"]
    with torch.no_grad():
        reference.get_input_embeddings().weight[index] = layer.grounded_embedding["default"]
        if "default" in layer.grounded_head:
            reference.get_output_embeddings().weight[index] = layer.grounded_head["default"]
    return reference


def inputs(new):
    return {
        "input_ids": torch.tensor([[5, new[0], 17, new[-1], 1], [new[3], 9, new[9], 300, 1]]),
        "decoder_input_ids": torch.tensor([[0, new[1], 40, new[12]], [0, 7, new[5], new[2]]]),
    }


def logits(model, batch):
    with torch.no_grad():
        return model(**batch).logits


@pytest.mark.parametrize(("arch", "tied"), CASES)
def test_every_embedding_module_uses_the_rows(tokenizer, arch, tied):
    model, reference, new = adapted(tokenizer, arch, tied)
    base = model.get_base_model()
    wrapped = [n for n, m in base.named_modules() if isinstance(m, GroundedTiedEmbedding)]
    assert sorted(n.rsplit(".", 2)[-2] for n in wrapped) == ["decoder", "encoder"]
    assert isinstance(base.get_input_embeddings(), GroundedTokenLayer)
    assert isinstance(base.get_output_embeddings(), GroundedHead)
    d = base.config.d_model
    assert model.get_nb_trainable_parameters()[0] == len(new) * d * (1 if tied else 2)  # one set, not copies
    expected = logits(rows_copied_in(reference, model), inputs(new))
    torch.testing.assert_close(logits(model, inputs(new)), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("arch", "tied"), CASES)
def test_gradient_reaches_the_rows_through_encoder_decoder_and_head(tokenizer, arch, tied):
    model, _, new = adapted(tokenizer, arch, tied)
    layer = model.get_input_embeddings()
    position = {token: i for i, token in enumerate(new)}
    plain = torch.tensor([[5, 17, 300, 1]])
    start = torch.tensor([[0, 7, 40]])

    def rows_with_gradient(loss, param):
        for p in model.parameters():
            p.grad = None
        loss.backward()
        grad = param.grad
        return [] if grad is None else grad.abs().sum(-1).nonzero().flatten().tolist()

    out = model(
        input_ids=torch.tensor([[5, new[0], 17, 1]]), decoder_input_ids=start, output_hidden_states=True
    )
    # one coordinate, not the sum: BART's final LayerNorm makes the sum over the width constant
    assert rows_with_gradient(
        out.encoder_last_hidden_state[..., 0].sum(), layer.grounded_embedding["default"]
    ) == [position[new[0]]]
    out = model(input_ids=plain, decoder_input_ids=torch.tensor([[0, new[1], 40]]), output_hidden_states=True)
    assert rows_with_gradient(
        out.decoder_hidden_states[-1][..., 0].sum(), layer.grounded_embedding["default"]
    ) == [position[new[1]]]
    out = model(input_ids=plain, decoder_input_ids=start)
    head_rows = layer.grounded_embedding["default"] if tied else layer.grounded_head["default"]
    assert rows_with_gradient(out.logits[..., new[2]].sum(), head_rows) == [position[new[2]]]


@pytest.mark.parametrize(("arch", "tied"), CASES)
def test_save_and_fresh_reload_are_bit_identical(tokenizer, tmp_path, arch, tied):
    model, reference, new = adapted(tokenizer, arch, tied)
    model.save_pretrained(tmp_path / "adapter")
    from transformers import AutoTokenizer

    base, _ = with_tokens(AutoTokenizer.from_pretrained(tokenizer.name_or_path), arch, tied)
    reloaded = PeftModel.from_pretrained(base, tmp_path / "adapter")
    expected = logits(model, inputs(new))
    assert torch.equal(logits(reloaded, inputs(new)), expected)
    torch.testing.assert_close(
        expected, logits(rows_copied_in(reference, model), inputs(new)), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize(("arch", "tied"), CASES)
def test_merged_model_loads_in_plain_transformers_with_the_same_logits(tokenizer, tmp_path, arch, tied):
    from transformers import AutoModelForSeq2SeqLM

    model, _, new = adapted(tokenizer, arch, tied)
    expected = logits(model, inputs(new))
    merged = model.merge_and_unload()
    assert not any(
        isinstance(m, (GroundedTokenLayer, GroundedTiedEmbedding, GroundedHead)) for m in merged.modules()
    )
    torch.testing.assert_close(logits(merged, inputs(new)), expected, rtol=1e-5, atol=1e-5)
    if not tied:  # transformers: an untied BART resized by set_input_embeddings shares one embedding module
        return  # between shared/encoder/decoder, and save_pretrained then drops encoder/decoder (not ours)
    merged.save_pretrained(tmp_path / "merged")
    plain = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "merged").eval()
    torch.testing.assert_close(logits(plain, inputs(new)), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("arch", "tied"), [("t5", True), ("bart", True)])
def test_lora_stacked_trains_saves_and_merges(tokenizer, tmp_path, arch, tied):
    model, _, new = adapted(tokenizer, arch, tied)
    peft_grounded.add_lora(model, r=2, lora_alpha=4, target_modules="all-linear")
    lora_layers = [m for m in model.modules() if isinstance(m, LoraLayer)]
    assert lora_layers and not any(isinstance(m, LoraLayer) for m in model.get_input_embeddings().modules())
    batch = inputs(new) | {"labels": torch.tensor([[new[1], 40, new[12], 1], [7, new[5], new[2], 1]])}
    model(**batch).loss.backward()
    rows = model.get_input_embeddings().grounded_embedding["default"]
    assert rows.grad is not None and all(m.lora_B["default"].weight.grad is not None for m in lora_layers)
    with torch.no_grad():
        for m in lora_layers:
            m.lora_B["default"].weight.add_(0.05)
    expected = logits(model, inputs(new))
    model.save_pretrained(tmp_path / "stacked")
    from transformers import AutoTokenizer

    base, _ = with_tokens(AutoTokenizer.from_pretrained(tokenizer.name_or_path), arch, tied)
    reloaded = PeftModel.from_pretrained(base, tmp_path / "stacked")
    assert torch.equal(logits(reloaded, inputs(new)), expected)
    merged = reloaded.merge_and_unload()
    torch.testing.assert_close(logits(merged, inputs(new)), expected, rtol=1e-4, atol=1e-4)


class _SharesTheEmbedding(nn.Module):
    """A module on the input embedding's weight that is not an nn.Embedding (the adapter cannot wrap it)."""

    def __init__(self, weight: nn.Parameter) -> None:
        super().__init__()
        self.weight = weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.T


def test_refuses_a_module_sharing_the_weight_that_it_cannot_wrap(tokenizer, tiny_model_factory):
    model = tiny_model_factory("llama", True)
    new = peft_grounded.add_sid_tokens(tokenizer, model, [4])
    model.model.extra_head = _SharesTheEmbedding(model.get_input_embeddings().weight)
    with pytest.raises(
        ValueError, match=r"'model\.extra_head' \(_SharesTheEmbedding\) shares the input embedding"
    ):
        get_peft_model(model, GroundedTokenConfig(token_indices=new))
    assert not any(isinstance(m, GroundedTokenLayer) for m in model.modules())  # refused before any change


def test_refuses_a_same_vocabulary_embedding_on_a_separate_weight():
    model = build_seq2seq("bart", tied=False)  # untied BART from a config: three separate embedding weights
    config = GroundedTokenConfig(token_indices=[100, 101], tokens_are_new=False, task_type="SEQ_2_SEQ_LM")
    with pytest.raises(ValueError, match=r"'model\.encoder\.embed_tokens' embeds the same vocabulary"):
        get_peft_model(model, config)


@pytest.mark.parametrize(("arch", "tied"), CASES)
def test_growing_keeps_the_rows_and_every_embedding_module_uses_the_new_ones(tokenizer, arch, tied):
    from helpers.growth_fixtures import grown_indices

    from peft_grounded.new_items import grow_adapter

    parent, child = grown_indices()
    base = build_seq2seq(arch, tied)
    tokens, centroids = parent.adapter_init()
    ids = peft_grounded.add_tokens(tokenizer, base, tokens)
    config = GroundedTokenConfig(
        token_indices=ids,
        init="centroid",
        init_vectors=centroids,
        task_type="SEQ_2_SEQ_LM",
    )
    model = get_peft_model(base, config)
    record_sid_facts(model, sid_index_fingerprint=parent.fingerprint())
    record_sid_facts(model, sid_index_fingerprint=parent.fingerprint())
    torch.manual_seed(1)
    with torch.no_grad():  # "trained": rows off their start
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.1 * torch.randn_like(p))
    layer = model.get_input_embeddings()
    rows = layer.grounded_embedding["default"].detach().clone()
    old = {
        "input_ids": torch.tensor([[5, ids[0], 17, ids[-1], 1], [ids[3], 9, ids[2], 300, 1]]),
        "decoder_input_ids": torch.tensor([[0, ids[1], 40, ids[4]], [0, 7, ids[5], ids[2]]]),
    }
    before = logits(model, old)

    grown = grow_adapter(model, tokenizer, parent, child).eval()
    glayer = grown.get_input_embeddings()
    assert torch.equal(glayer.grounded_embedding["default"][: parent.n_tokens], rows)
    assert sid_record(grown)["sid_index_fingerprint"] == child.fingerprint()
    torch.testing.assert_close(logits(grown, old)[..., : before.shape[-1]], before, rtol=1e-5, atol=1e-5)
    # the new tokens: encoder input, decoder input and head all read the grown rows
    new = grown.peft_config["default"].token_indices[parent.n_tokens :]
    assert new and tokenizer.convert_ids_to_tokens(new) == child.token_strings[parent.n_tokens :]
    batch = {
        "input_ids": torch.tensor([[5, new[0], ids[1], 1]]),
        "decoder_input_ids": torch.tensor([[0, new[-1], 40]]),
    }
    from transformers import AutoTokenizer

    reference = build_seq2seq(arch, tied)
    peft_grounded.add_tokens(
        AutoTokenizer.from_pretrained(tokenizer.name_or_path), reference, child.token_strings
    )
    expected = logits(rows_copied_in(reference, grown), batch)
    torch.testing.assert_close(logits(grown, batch), expected, rtol=1e-5, atol=1e-5)
