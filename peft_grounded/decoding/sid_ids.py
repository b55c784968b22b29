"""Convert items' SIDs (text or token strings) to the token-id sequences decoding works on."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any


def sid_token_ids(
    tokenizer: Any, item_sids: Mapping[Hashable, str | Sequence[str]]
) -> dict[Hashable, list[int]]:
    """Item id -> SID token ids, checking that every SID token is one token added to ``tokenizer``.

    A SID is given as its text (``"<a_12><b_3><c_200>"``) or as its list of token strings. Fails when a SID
    would be split into ordinary sub-word pieces, i.e. when its tokens were not added to the tokenizer.
    """
    added = tokenizer.get_added_vocab()
    result: dict[Hashable, list[int]] = {}
    for item, sid in item_sids.items():
        if isinstance(sid, str):
            ids = tokenizer(sid, add_special_tokens=False)["input_ids"]
            pieces = tokenizer.convert_ids_to_tokens(ids)
            if "".join(pieces) != sid:
                raise ValueError(
                    f"item {item!r}: SID {sid!r} tokenises as {pieces}, not as SID tokens; "
                    "add the SID tokens to the tokenizer (and resize the model) first"
                )
        else:
            pieces = list(sid)
            ids = [added.get(piece, -1) for piece in pieces]
        missing = [piece for piece, i in zip(pieces, ids, strict=True) if added.get(piece) != i]
        if not ids or missing:
            raise ValueError(
                f"item {item!r}: SID tokens {missing or pieces} are not in the tokenizer's added vocabulary; "
                "add the SID tokens to the tokenizer (and resize the model) first"
            )
        result[item] = list(ids)
    return result
