"""SID text or token strings -> token ids, refusing SIDs whose tokens were not added."""

from __future__ import annotations

import pytest

from peft_grounded.decoding import sid_token_ids


def test_text_and_token_lists_give_the_added_ids(tokenizer):
    tokenizer.add_tokens(["<a_0>", "<a_1>", "<b_0>", "<b_7>"])
    ids = sid_token_ids(tokenizer, {"m1": "<a_1><b_7>", 2: ["<a_0>", "<b_0>"]})
    expected = tokenizer.convert_tokens_to_ids(["<a_1>", "<b_7>", "<a_0>", "<b_0>"])
    assert ids == {"m1": expected[:2], 2: expected[2:]}
    assert all(i >= 49152 for sid in ids.values() for i in sid)


@pytest.mark.parametrize("sid", ["<a_1><b_9>", ["<a_1>", "<b_9>"], "", []])
def test_tokens_missing_from_the_tokenizer_are_refused(tokenizer, sid):
    tokenizer.add_tokens(["<a_1>"])
    with pytest.raises(ValueError, match="add the SID tokens"):
        sid_token_ids(tokenizer, {"item": sid})
