"""GroundedTokenConfig as small and reusable as LoraConfig: Literal choices, no mutation of the caller's object,
data-driven starts after creation (PEFT's EVA convention), and no application data in the config."""

from __future__ import annotations

import json
import typing

import pytest
import torch
from peft import get_peft_model

import peft_grounded
from peft_grounded import GroundedTokenConfig, initialize_grounded_rows
from peft_grounded.adapter.config import describe_tensor
from peft_grounded.adapter.starts import INITS, PROJECTIONS


def fresh(tokenizer):
    """Another copy of the test tokenizer (each model gets the SID tokens added once)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer.name_or_path)


def test_choices_are_literals():
    hints = typing.get_type_hints(GroundedTokenConfig)
    literal, none = typing.get_args(hints["init"])  # None: not given, the start init_weights picks
    assert typing.get_args(literal) == INITS and none is type(None)
    assert typing.get_args(hints["centroid_projection"]) == PROJECTIONS
    json.dumps(GroundedTokenConfig(token_indices=[10, 11]).to_dict())  # JSON-able as it is


def test_one_config_wraps_two_models_each_with_its_own_provenance(tokenizer, tiny_model_factory):
    first, second = tiny_model_factory("llama", False, seed=0), tiny_model_factory("llama", False, seed=1)
    new = peft_grounded.add_sid_tokens(tokenizer, first, [4, 4])
    peft_grounded.add_tokens(fresh(tokenizer), second, new.tokens)
    vectors = torch.randn(len(new), 24, generator=torch.Generator().manual_seed(0))
    config = GroundedTokenConfig(token_indices=new, init="centroid", init_vectors=vectors)
    hyper = ("provenance", "target_modules", "base_model_name_or_path")
    before = {k: v for k, v in config.to_dict().items() if k not in hyper}
    models = [get_peft_model(first, config), get_peft_model(second, config)]
    assert {k: v for k, v in config.to_dict().items() if k not in hyper} == before
    own = [m.peft_config["default"] for m in models]
    assert own[0] is config and own[1] is not config  # the first keeps it (PEFT's way); another base, a copy
    rows = first.get_input_embeddings().base_layer.weight.shape[0]
    assert own[0].provenance.num_embeddings == own[1].provenance.num_embeddings == rows
    assert own[0].provenance.embedding_signature != own[1].provenance.embedding_signature  # each base's rows
    assert own[0].provenance.vocab_fingerprint == own[1].provenance.vocab_fingerprint == new.vocab_fingerprint
    assert own[1].runtime_config.init_vectors is vectors  # the start's data, shared, never saved
    rows = [m.get_input_embeddings().grounded_embedding["default"] for m in models]
    assert not torch.equal(rows[0], rows[1])  # projected onto each base's vocabulary


def test_runtime_data_are_dropped_and_facts_kept_in_provenance(tmp_path):
    vectors = torch.randn(2, 5)
    config = GroundedTokenConfig(token_indices=[10, 11], init="centroid", init_vectors=vectors)
    assert config.runtime_config.init_vectors is vectors and "runtime_config" not in config.to_dict()
    assert {"init_vectors", "num_embeddings", "embedding_signature"}.isdisjoint(config.to_dict())
    config.record_start()
    config.save_pretrained(tmp_path)
    loaded = GroundedTokenConfig.from_pretrained(tmp_path)
    assert loaded.provenance.init_data == {"init_vectors": describe_tensor(vectors)}
    assert loaded.runtime_config.init_vectors is None and loaded.runtime_config.rows_from_checkpoint
    assert not config.runtime_config.rows_from_checkpoint


@pytest.mark.parametrize("tied", [True, False])
def test_data_after_creation_gives_the_rows_of_the_one_liner(tokenizer, tiny_model_factory, tied, tmp_path):
    vectors = torch.randn(8, 100, generator=torch.Generator().manual_seed(1))
    made = []
    for later in (False, True):
        base = tiny_model_factory("llama", tied)
        new = peft_grounded.add_sid_tokens(fresh(tokenizer), base, [4, 4])
        if later:
            with pytest.warns(
                UserWarning, match="start at the vocabulary mean until initialize_grounded_rows"
            ):
                model = get_peft_model(base, GroundedTokenConfig(token_indices=new, init="centroid"))
            mean = base.get_input_embeddings().weight[: new.original_vocab_size].double().mean(0).float()
            assert torch.equal(model.get_input_embeddings().grounded_embedding["default"][0], mean)
            assert initialize_grounded_rows(model, vectors=vectors) is model
        else:
            model = get_peft_model(
                base, GroundedTokenConfig(token_indices=new, init="centroid", init_vectors=vectors)
            )
        model.save_pretrained(tmp_path / str(later))
        made.append(model)
    layers = [m.get_input_embeddings() for m in made]
    assert torch.equal(layers[0].grounded_embedding["default"], layers[1].grounded_embedding["default"])
    if not tied:
        assert torch.equal(layers[0].grounded_head["default"], layers[1].grounded_head["default"])
    records = [
        json.loads((tmp_path / str(later) / "adapter_config.json").read_text()) for later in (False, True)
    ]
    recorded = [r["provenance"]["init_data"] for r in records]
    assert recorded[0] == recorded[1] == {"init_vectors": describe_tensor(vectors)}  # recorded the same way
    assert recorded[0]["init_vectors"].startswith("in-memory float32[8, 100]")
    assert "init_vectors" not in records[0]  # the data themselves: runtime, never saved


def test_description_texts_are_tokenised_outside_get_peft_model(tokenizer, tiny_model_factory):
    texts = ["Toy Story", "GoldenEye; Four Rooms", "", "Get Shorty"]
    base = tiny_model_factory("llama", True)
    new = peft_grounded.add_sid_tokens(tokenizer, base, [4])
    config = GroundedTokenConfig(token_indices=new, init="description", init_texts=texts)
    assert "tokenizer_name_or_path" not in config.to_dict()  # nothing to load a tokenizer from
    with pytest.warns(UserWarning, match="init_texts as token ids"):
        model = get_peft_model(base, config)
    with pytest.raises(ValueError, match="tokenise them with the model's tokenizer"):
        initialize_grounded_rows(model)
    with pytest.warns(UserWarning, match="empty description"):
        initialize_grounded_rows(model, tokenizer=tokenizer)  # the config's own texts
    rows = model.get_input_embeddings().grounded_embedding["default"]
    ids = tokenizer("Get Shorty", add_special_tokens=False)["input_ids"]
    expected = base.get_input_embeddings().base_layer.weight[ids].double().mean(0).float()
    torch.testing.assert_close(rows[3], expected, rtol=0, atol=1e-6)
    config = model.peft_config["default"]
    assert config.runtime_config.init_texts[3] == config.provenance.init_data["init_texts"][3] == ids
    with pytest.raises(ValueError, match="takes no data"):
        initialize_grounded_rows(
            get_peft_model(tiny_model_factory("llama", True), GroundedTokenConfig(token_indices=[10]))
        )


def test_the_config_holds_no_application_data(tmp_path):
    """The recommender's record (SID index, prompt format) is not a config field: it is saved beside the
    adapter (sid_record.json), and the config refuses it."""
    config = GroundedTokenConfig(token_indices=[10, 11])
    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "adapter_config.json").read_text())
    assert not {"metadata", "sid_index_fingerprint", "prompt_format", "peft_grounded"} & set(saved)
    for field in ("metadata", "sid_index_fingerprint"):
        with pytest.raises(TypeError, match=field):
            GroundedTokenConfig(token_indices=[10], **{field: "abc"})


def test_every_field_has_help_as_loraconfigs_do():
    import dataclasses

    from peft_grounded import GroundedProvenance, GroundedRuntimeConfig

    for cls in (GroundedTokenConfig, GroundedRuntimeConfig, GroundedProvenance):
        assert all(f.metadata.get("help") for f in dataclasses.fields(cls)), cls.__name__
    own = {f.name for f in dataclasses.fields(GroundedTokenConfig)} - {
        f.name for f in dataclasses.fields(peft_grounded.adapter.config.PeftConfig)
    }
    assert len(own) == 16  # the count docs/adapter.md gives beside LoraConfig
