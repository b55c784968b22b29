"""Incremental grounding of the new items: only the masked rows move, the rest stays bit-identical."""

from __future__ import annotations

import pytest
import torch
from test_adapter_grow import grown_indices, trained

from peft_grounded.adapter import grow_adapter
from peft_grounded.grounding.incremental import ground_new_items, rows_used
from peft_grounded.sids import Catalogue, Item


@pytest.mark.parametrize(("tied", "lora", "rows"), [(True, False, "used"), (False, True, "new")])
def test_only_the_new_items_rows_train(tokenizer, tiny_model_factory, tied, lora, rows):
    parent, child = grown_indices()
    model = trained(tokenizer, tiny_model_factory, parent, "llama", tied, lora)
    grown = grow_adapter(model, tokenizer, parent, child)
    catalogue = Catalogue(
        "new", {i: Item(i, title=f"A brand new film {i}", description="Fresh.") for i in child.item_ids[16:]}
    )
    layer = grown.get_input_embeddings()
    before = {n: p.detach().clone() for n, p in grown.named_parameters()}
    flags = {n: p.requires_grad for n, p in grown.named_parameters()}
    result = ground_new_items(
        grown, tokenizer, parent, child, catalogue, rows=rows, steps=6, learning_rate=1e-2, batch_size=4
    )
    expected = (
        rows_used(child, child.item_ids[16:])
        if rows == "used"
        else list(range(parent.n_tokens, child.n_tokens))
    )
    assert result.trained_rows == expected and result.n_items == 3 and result.n_examples > 0
    assert result.losses[-1] < result.losses[0]
    mask = torch.zeros(child.n_tokens, dtype=torch.bool)
    mask[expected] = True
    for name, p in grown.named_parameters():
        if ".grounded_" in name:
            assert torch.equal(p[~mask], before[name][~mask]), name  # untouched rows: bit-identical
            assert not torch.equal(p[mask], before[name][mask]), name
        else:
            assert torch.equal(p, before[name]), name  # backbone and LoRA unchanged
        assert p.requires_grad == flags[name]
    assert layer is grown.get_input_embeddings()
