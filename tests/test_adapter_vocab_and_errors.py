"""Vocabulary extension and every bad input the adapter must refuse with a clear message."""

from __future__ import annotations

import pytest
import torch
from peft import PeftModel, get_peft_model
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

import peft_grounded
from peft_grounded import GroundedTokenConfig
from peft_grounded.adapter import GroundedTokenLayer


def fresh(tokenizer):
    return AutoTokenizer.from_pretrained(tokenizer.name_or_path)


# --- vocabulary extension -------------------------------------------------------------------------------


def test_add_sid_tokens_names_resizes_and_fills_with_the_mean(tokenizer, tiny_model_factory):
    model = tiny_model_factory("llama", False)
    before = len(tokenizer)
    new = peft_grounded.add_sid_tokens(tokenizer, model, [3, 2])
    assert new.tokens == ["<a_0>", "<a_1>", "<a_2>", "<b_0>", "<b_1>"]
    assert list(new) == tokenizer.convert_tokens_to_ids(new.tokens) == list(range(before, before + 5))
    assert tokenizer("<a_2><b_1>", add_special_tokens=False)["input_ids"] == [new[2], new[4]]
    assert model.get_input_embeddings().weight.shape[0] == before + 5 == model.config.vocab_size
    for matrix in (model.get_input_embeddings().weight, model.get_output_embeddings().weight):
        mean = matrix[:before].double().mean(0).to(matrix.dtype)
        assert torch.equal(matrix[new[0]], mean) and torch.equal(matrix[new[-1]], mean)


def test_custom_template_and_padding(tokenizer, tiny_model_factory):
    model = tiny_model_factory("llama", True)
    new = peft_grounded.add_sid_tokens(
        tokenizer, model, [2, 2], template="[{level_index}:{code}]", pad_to_multiple_of=64
    )
    assert new.tokens == ["[0:0]", "[0:1]", "[1:0]", "[1:1]"]
    assert model.get_input_embeddings().weight.shape[0] % 64 == 0


def test_qwen3_style_padded_rows_host_the_new_tokens(tokenizer, tiny_model_factory):
    model = tiny_model_factory("qwen3", True, extra_rows=64)
    rows = model.get_input_embeddings().weight.shape[0]
    assert rows > len(tokenizer)
    new = peft_grounded.add_sid_tokens(tokenizer, model, [4])
    assert model.get_input_embeddings().weight.shape[0] == rows  # never shrunk, no resize needed
    assert list(new) == tokenizer.convert_tokens_to_ids(new.tokens) and max(new) < rows
    peft_model = get_peft_model(model, GroundedTokenConfig(token_indices=new, init="random"))
    layer = peft_model.get_input_embeddings()
    ids = torch.as_tensor([new])
    out = layer(ids)[0]
    assert torch.equal(out, layer.grounded_embedding["default"])  # the rows the adapter trains


def test_add_tokens_refuses_bad_requests(tokenizer, tiny_model_factory):
    model = tiny_model_factory("llama", True)
    with pytest.raises(ValueError, match="already exist"):
        peft_grounded.add_tokens(tokenizer, model, ["hello", "<brand_new>"])
    with pytest.raises(ValueError, match="more than once"):
        peft_grounded.add_tokens(tokenizer, model, ["<x>", "<x>"])
    with pytest.raises(ValueError, match="Empty"):
        peft_grounded.add_tokens(tokenizer, model, ["<x>", ""])
    assert "<brand_new>" not in tokenizer.get_vocab()  # nothing half-added
    new = peft_grounded.add_tokens(tokenizer, model, ["<x>"])
    wrapped = get_peft_model(model, GroundedTokenConfig(token_indices=new))
    with pytest.raises(ValueError, match="before get_peft_model"):
        peft_grounded.add_tokens(fresh(tokenizer), wrapped, ["<y>"])


# --- bad input ---------------------------------------------------------------------------------------------


@pytest.fixture
def extended(tokenizer, tiny_model_factory):
    model = tiny_model_factory("llama", True)
    return model, peft_grounded.add_sid_tokens(tokenizer, model, [4, 4])


def assert_untouched(model):
    assert not isinstance(model.get_input_embeddings(), GroundedTokenLayer)
    assert not hasattr(model, "peft_config")


def test_vector_count_must_match(extended):
    model, new = extended
    with pytest.raises(ValueError, match="one vector per token"):
        get_peft_model(
            model, GroundedTokenConfig(token_indices=new, init="centroid", init_vectors=torch.randn(7, 32))
        )
    assert_untouched(model)


def test_nan_or_inf_vectors_are_named(extended):
    model, new = extended
    vectors = torch.randn(8, 32)
    vectors[3, 1] = float("nan")
    vectors[5, 0] = float("inf")
    with pytest.raises(ValueError, match=r"NaN or Inf in rows \[3, 5\]"):
        get_peft_model(model, GroundedTokenConfig(token_indices=new, init="centroid", init_vectors=vectors))
    assert_untouched(model)


def test_width_mismatch_without_projection(extended):
    model, new = extended
    with pytest.raises(ValueError, match="init='centroid'"):
        get_peft_model(
            model, GroundedTokenConfig(token_indices=new, init="tensor", init_vectors=torch.randn(8, 32))
        )
    with pytest.raises(ValueError, match="narrower"):
        get_peft_model(
            model,
            GroundedTokenConfig(
                token_indices=new,
                init="centroid",
                init_vectors=torch.randn(8, 32),
                centroid_projection="truncate",
            ),
        )
    assert_untouched(model)


def test_token_indices_out_of_range_duplicated_or_inside_the_vocabulary(extended):
    model, new = extended
    rows = model.get_input_embeddings().weight.shape[0]
    with pytest.raises(ValueError, match="out of range"):
        get_peft_model(model, GroundedTokenConfig(token_indices=[rows - 1, rows + 3]))
    with pytest.raises(ValueError, match="more than once"):
        GroundedTokenConfig(token_indices=[new[0], new[1], new[0]])
    with pytest.raises(ValueError, match="inside the original vocabulary"):
        GroundedTokenConfig(token_indices=[5, new[0]], original_vocab_size=new.original_vocab_size)
    with pytest.raises(ValueError, match="empty"):
        GroundedTokenConfig(token_indices=[])
    assert_untouched(model)


def test_unknown_init_name(extended):
    with pytest.raises(ValueError, match="Unknown init 'centroids'"):
        GroundedTokenConfig(token_indices=[10], init="centroids")
    model, new = extended
    config = GroundedTokenConfig(token_indices=new, init="centroid")  # the data may come later (EVA's way)
    with pytest.warns(UserWarning, match="needs init_vectors"):
        get_peft_model(model, config)


def test_adapter_refuses_a_base_with_another_vocabulary(tokenizer, tiny_model_factory, tmp_path):
    model = tiny_model_factory("llama", True)
    new = peft_grounded.add_sid_tokens(tokenizer, model, [4, 4])
    get_peft_model(model, GroundedTokenConfig(token_indices=new)).save_pretrained(tmp_path / "a")

    smaller = tiny_model_factory("llama", True)
    peft_grounded.add_sid_tokens(fresh(tokenizer), smaller, [4, 3])
    with pytest.raises(ValueError, match="rows, but the base has"):
        PeftModel.from_pretrained(smaller, tmp_path / "a")

    other_weights = tiny_model_factory("llama", True, seed=1)
    peft_grounded.add_sid_tokens(fresh(tokenizer), other_weights, [4, 4])
    with pytest.raises(ValueError, match="belongs to another base model"):
        PeftModel.from_pretrained(other_weights, tmp_path / "a")

    config = peft_grounded.GroundedTokenConfig.from_pretrained(tmp_path / "a")
    shuffled = fresh(tokenizer)
    shuffled.add_tokens(list(reversed(new.tokens)))
    with pytest.raises(ValueError, match="sit elsewhere"):
        peft_grounded.check_tokenizer(config, shuffled)
    peft_grounded.check_tokenizer(config, tokenizer)  # the right tokenizer passes


def test_untied_head_that_cannot_be_found(tokenizer):
    class HiddenHead(LlamaForCausalLM):
        def get_output_embeddings(self):
            return None

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=False,
    )
    model = HiddenHead(config)
    new = peft_grounded.add_tokens(tokenizer, model, ["<q_0>", "<q_1>"])
    with pytest.raises(ValueError, match="output layer could not be found"):
        get_peft_model(model, GroundedTokenConfig(token_indices=new))
    assert_untouched(model)
    with pytest.raises(ValueError, match="not a module"):
        get_peft_model(model, GroundedTokenConfig(token_indices=new, output_module="decoder_head"))
    with pytest.raises(ValueError, match="was not resized"):  # transformers could not resize a hidden head
        get_peft_model(model, GroundedTokenConfig(token_indices=new, output_module="lm_head"))
    assert_untouched(model)
    head = torch.nn.Linear(32, model.get_input_embeddings().weight.shape[0], bias=False)
    head.weight.data[: model.lm_head.weight.shape[0]] = model.lm_head.weight.data
    model.lm_head = head
    wrapped = get_peft_model(model, GroundedTokenConfig(token_indices=new, output_module="lm_head"))
    assert "default" in wrapped.get_input_embeddings().grounded_head


def test_resizing_after_wrapping_is_refused(extended):
    model, new = extended
    wrapped = get_peft_model(model, GroundedTokenConfig(token_indices=new))
    with pytest.raises(RuntimeError, match="resizing its embeddings now"):
        wrapped.resize_token_embeddings(len(new) + 10)
    layer = wrapped.get_input_embeddings()
    layer.base_layer.weight = torch.nn.Parameter(
        torch.zeros(layer.num_embeddings + 4, 64)
    )  # resized behind its back
    with pytest.raises(RuntimeError, match="resized from"):
        wrapped(input_ids=torch.tensor([[1, new[0]]]))


def test_a_recorded_config_describes_its_data_and_waits_for_them(extended, tmp_path):
    from peft import PeftConfig

    from peft_grounded.adapter.config import describe_tensor

    model, new = extended
    vectors = torch.randn(8, 16)
    config = GroundedTokenConfig(token_indices=new, init="centroid", init_vectors=vectors)
    config.record_start()
    config.save_pretrained(tmp_path)
    recorded = PeftConfig.from_pretrained(tmp_path)  # not marked as a checkpoint: the start needs its data
    assert recorded.provenance.init_data == {"init_vectors": describe_tensor(vectors)}
    with pytest.warns(UserWarning, match="needs init_vectors"):  # EVA's way: the data come afterwards
        wrapped = get_peft_model(model, recorded)
    peft_grounded.initialize_grounded_rows(wrapped, vectors=vectors)
    with pytest.raises(ValueError, match="recorded as 'in-memory"):  # a description is not the data
        peft_grounded.initialize_grounded_rows(wrapped, vectors=describe_tensor(vectors))
