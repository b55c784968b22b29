"""Growing a trained grounded adapter onto a grown SID index: exact carry-over, save/reload/merge, serving."""

from __future__ import annotations

import pytest
import torch
from helpers.growth_fixtures import grown_indices, trained
from helpers.toy_catalogue import toy_catalogue, toy_index, toy_vectors
from peft import PeftModel

import peft_grounded
from peft_grounded.decoding import recommend, sid_token_ids
from peft_grounded.new_items import add_items, grow_adapter
from peft_grounded.sids import Item
from peft_grounded.sids.extended_base import sid_record


@pytest.fixture(scope="module")
def indices():
    return grown_indices()


VARIANTS = [
    ("llama", True, False, torch.float32),
    ("llama", False, True, torch.float32),
    ("qwen3", False, False, torch.float32),
    ("qwen3", True, True, torch.float32),
    ("llama", False, True, torch.bfloat16),  # float32 master rows over a bf16 base
]


@pytest.mark.parametrize(("arch", "tied", "lora", "dtype"), VARIANTS)
def test_grown_adapter_keeps_trained_rows_and_lora_and_reloads(
    tokenizer, tiny_model_factory, smollm2_dir, indices, tmp_path, arch, tied, lora, dtype
):
    parent, child = indices
    model = trained(tokenizer, tiny_model_factory, parent, arch, tied, lora, dtype)
    layer = model.get_input_embeddings()
    rows = layer.grounded_embedding["default"].detach().clone()
    head = None if tied else layer.grounded_head["default"].detach().clone()
    loras = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    assert bool(loras) == lora
    ids = torch.tensor([[1, 17, *model.peft_config["default"].token_indices[:5], 400]])
    with torch.no_grad():
        before = model(ids).logits

    grown = grow_adapter(model, tokenizer, parent, child).eval()
    config = grown.peft_config["default"]
    n_old, n_new = parent.n_tokens, child.n_tokens - parent.n_tokens
    glayer = grown.get_input_embeddings()
    assert torch.equal(glayer.grounded_embedding["default"][:n_old], rows)
    assert glayer.grounded_embedding["default"].shape[0] == n_old + n_new
    if not tied:
        assert torch.equal(glayer.grounded_head["default"][:n_old], head)
    for name, value in loras.items():
        assert torch.equal(dict(grown.named_parameters())[name], value)
    assert (
        sid_record(grown)["sid_index_fingerprint"] == child.fingerprint()
        and config.token_strings == child.token_strings
    )
    assert tokenizer.convert_ids_to_tokens(config.token_indices) == child.token_strings
    child.check_adapter(config, recorded=sid_record(grown)["sid_index_fingerprint"])
    with torch.no_grad():
        after = grown(ids).logits
    if dtype == torch.float32:
        assert torch.equal(after[..., : before.shape[-1]], before)  # old tokens, old logits, exactly
    else:  # bf16 GEMMs accumulate differently for a head with more rows: the weights above are exact
        torch.testing.assert_close(after[..., : before.shape[-1]], before, rtol=2e-2, atol=2e-2)
    # new rows: centroid init lands them among the parent's rows, not at the vocabulary mean
    new_rows = glayer.grounded_embedding["default"][n_old:]
    vocab_mean = (
        glayer.base_layer.weight[: config.base_vocab_size].double().mean(0).float().to(new_rows.dtype)
    )
    assert torch.isfinite(new_rows).all() and not torch.allclose(new_rows, vocab_mean.expand_as(new_rows))

    grown.save_pretrained(tmp_path / "grown")
    from transformers import AutoTokenizer

    tok2 = AutoTokenizer.from_pretrained(smollm2_dir)
    base2 = tiny_model_factory(arch, tied, dtype=dtype)
    peft_grounded.add_tokens(tok2, base2, child.token_strings)
    reloaded = PeftModel.from_pretrained(base2, str(tmp_path / "grown")).eval()
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, after)
        merged = reloaded.merge_and_unload()
        tol = 1e-5 if dtype == torch.float32 else 5e-2  # merging writes the float32 rows into bf16 weights
        torch.testing.assert_close(merged(ids).logits, after, rtol=tol, atol=tol)


def test_other_inits_and_refusals(tokenizer, tiny_model_factory, indices):
    parent, child = indices
    model = trained(tokenizer, tiny_model_factory, parent, "llama", True, False)
    with pytest.raises(ValueError, match="not this SID index's"):
        grow_adapter(model, tokenizer, child, parent)  # swapped: the adapter is the parent's
    with pytest.raises(ValueError, match="did not grow from"):
        grow_adapter(model, tokenizer, parent, toy_index(toy_catalogue(), seed=1))
    with pytest.raises(ValueError, match="needs init_vectors"):
        grow_adapter(model, tokenizer, parent, child, init="tensor")
    assert not any(t in tokenizer.get_vocab() for t in child.token_strings[parent.n_tokens :])  # untouched
    grown = grow_adapter(model, tokenizer, parent, child, init="mean")
    layer = grown.get_input_embeddings()
    new_rows = layer.grounded_embedding["default"][parent.n_tokens :]
    mean = layer.base_layer.weight[: grown.peft_config["default"].base_vocab_size].double().mean(0).float()
    torch.testing.assert_close(new_rows, mean.expand_as(new_rows))  # mean init


def test_a_new_item_is_served_by_constrained_beam_search(tokenizer, tiny_model_factory, indices):
    parent, child = indices
    model = trained(tokenizer, tiny_model_factory, parent, "llama", True, False)
    grown = grow_adapter(model, tokenizer, parent, child).eval()
    catalogue = sid_token_ids(tokenizer, child.sid_map())
    assert child.item_interactions[child.row_of("new0")] == 0  # never interacted with
    result = recommend(grown, tokenizer, ["Recommend an item:"], catalogue, k=child.n_items)
    produced = set(result.items[0])
    assert {"new0", "new1", "new2"} <= produced and result.num_invalid == 0
    # evaluation takes the grown index: a new-item target is scored (a cold target, reachable)
    from peft_grounded.evaluation import evaluate_split

    n = child.n_items
    ranked = recommend(grown, tokenizer, ["Recommend an item:"], catalogue, k=n, num_beams=n).items
    results = {"test": evaluate_split(ranked, ["new1"], {"new0", "new1", "new2"}, ks=(n,), items=catalogue)}
    assert results["test"]["cold"][f"recall@{n}"] == 1.0


def test_a_child_without_new_tokens_only_changes_the_recorded_index(tokenizer, tiny_model_factory):
    catalogue = toy_catalogue()
    parent = toy_index(catalogue)
    x = toy_vectors(catalogue)
    sizes = {}
    for row in parent.codes[:, :-1].tolist():
        sizes[tuple(row)] = sizes.get(tuple(row), 0) + 1
    fits = [
        i
        for i, row in enumerate(parent.quantize(x).tolist())
        if sizes[tuple(row)] < parent.codes_per_level[-1]
    ]
    assert fits, "the toy index has a SID group with a free disambiguation code"
    child = add_items(parent, [Item("fresh", title="Fresh")], vectors=x[fits[:1]] + 1e-3)
    assert child.token_strings == parent.token_strings
    model = trained(tokenizer, tiny_model_factory, parent, "llama", True, True)
    rows = model.get_input_embeddings().grounded_embedding["default"].detach().clone()
    n_vocab = len(tokenizer)
    grown = grow_adapter(model, tokenizer, parent, child)
    assert len(tokenizer) == n_vocab and torch.equal(
        grown.get_input_embeddings().grounded_embedding["default"], rows
    )
    assert sid_record(grown)["sid_index_fingerprint"] == child.fingerprint()
    child.check_adapter(grown.peft_config["default"], recorded=child.fingerprint())


def test_new_rows_start_at_the_parents_init_scale(tokenizer, tiny_model_factory, indices):
    from transformers import AutoTokenizer

    parent, child = indices
    grown = {}
    for scale in (1.0, 0.2):
        tok = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
        model = trained(tok, tiny_model_factory, parent, "qwen3", False, False)
        model.peft_config["default"].init_scale = scale  # as if the parent had started at this scale
        grown[scale] = grow_adapter(model, tok, parent, child)
    layer = grown[0.2].get_input_embeddings()
    n_old = parent.n_tokens
    for name in ("grounded_embedding", "grounded_head"):  # input rows and the untied head's rows
        weight = layer.base_layer.weight if name == "grounded_embedding" else layer.head.weight
        mean = weight[: grown[0.2].peft_config["default"].base_vocab_size].double().mean(0)
        plain = getattr(grown[1.0].get_input_embeddings(), name)["default"][n_old:].double()
        scaled = getattr(layer, name)["default"][n_old:].double()
        torch.testing.assert_close(scaled - mean, 0.2 * (plain - mean), rtol=1e-4, atol=1e-5)
    # the grown adapter's rows are given as they are: its config does not scale them again on a re-creation
    assert grown[0.2].peft_config["default"].init_scale == 1.0
