"""A grown adapter and its index version travel together on the (loopback) Hub; mismatched versions fail."""

from __future__ import annotations

import pytest
import torch
from helpers.growth_fixtures import grown_indices, trained
from huggingface_hub import HfApi
from transformers import AutoTokenizer

from peft_grounded.hub import GroundedHubError, load_grounded, load_sid_index, push_grounded
from peft_grounded.new_items import grow_adapter
from peft_grounded.sids.extended_base import sid_record

FACTS = {"base_model": "org/tiny-base"}


@pytest.fixture(scope="module")
def indices():
    return grown_indices()


def test_push_a_grown_adapter_with_its_index_version(
    tokenizer, tiny_model_factory, indices, hub_endpoint, tmp_path
):
    parent, child = indices
    model = trained(tokenizer, tiny_model_factory, parent, "llama", False, True)
    push_grounded(model, "user/v1", tokenizer=tokenizer, index=parent, card_facts=FACTS)
    grown = grow_adapter(model, tokenizer, parent, child).eval()
    with pytest.raises(GroundedHubError, match="push that one"):
        push_grounded(grown, "user/v2", index=parent, card_facts=FACTS)  # the adapter's version is the child
    push_grounded(grown, "user/v2", tokenizer=tokenizer, index=child, card_facts=FACTS)

    loaded_index = load_sid_index("user/v2")
    assert loaded_index.fingerprint() == child.fingerprint() and loaded_index.parent == parent.fingerprint()
    fresh = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    loaded = load_grounded(tiny_model_factory("llama", False), fresh, "user/v2")
    assert sid_record(loaded)["sid_index_fingerprint"] == child.fingerprint()  # the record came along
    loaded_index.check_adapter(
        loaded.peft_config["default"], recorded=sid_record(loaded)["sid_index_fingerprint"]
    )
    ids = torch.tensor([[1, 17, *loaded.peft_config["default"].token_indices[-3:], 400]])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, grown(ids).logits)

    # a repo whose index was replaced by another version: loading the index names the mismatch
    child.save(tmp_path / "sid_index")
    HfApi().upload_folder(repo_id="user/v1", folder_path=tmp_path, allow_patterns=["sid_index/*"])
    with pytest.raises(GroundedHubError, match=r"does not match its adapter.*grow the adapter"):
        load_sid_index("user/v1")
