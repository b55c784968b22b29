"""What a decoding step scores: the model's whole head, or its SID rows only (the SID-only softmax).

A model trained with ``sid_softmax`` (recorded in its adapter's SID record) learnt each SID token's
probability normalised over the SID tokens, so decoding and scoring normalise the same way: each step runs
the backbone and ``hidden @ W[sid_ids].T`` through the head's SID rows (the grounded rows from the adapter),
a few hundred columns instead of the 49,152-row head. Other models keep the full head.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..sid_head import head_rows, sid_columns, supports_compact_head


def _transformers_model(model: Any) -> Any:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def model_sid_ids(model: Any) -> torch.Tensor:
    """The sorted token ids of the SID rows of ``model``'s grounded adapter (what it trained its softmax over)."""
    tuner = getattr(model, "base_model", None)
    if not hasattr(tuner, "grounded_token_ids"):
        raise ValueError(
            "sid_softmax=True decodes over the SID rows of a grounded-token adapter; this model has none. "
            "Decode with sid_softmax=False."
        )
    return tuner.grounded_token_ids()


SIDSoftmax = bool | None | Sequence[int] | torch.Tensor
"""How a decoding step normalises: ``True`` over the adapter's SID rows, ``False`` over the whole vocabulary,
``None`` as the model's adapter recorded, or the SID rows' token ids (a model whose adapter was merged away)."""


def wants_sid_softmax(model: Any, sid_softmax: bool | None) -> bool:
    """``sid_softmax``, or when None what ``model``'s adapter recorded (False without a record)."""
    if sid_softmax is not None:
        return bool(sid_softmax)
    from ..sids.extended_base import sid_softmax_of

    return sid_softmax_of(model)


def sid_rows(model: Any, sid_softmax: SIDSoftmax) -> torch.Tensor | None:
    """The sorted token ids a step normalises over (``None``: the whole vocabulary); see :data:`SIDSoftmax`."""
    if isinstance(sid_softmax, bool) or sid_softmax is None:
        return model_sid_ids(model) if wants_sid_softmax(model, sid_softmax) else None
    rows = torch.as_tensor(sid_softmax, dtype=torch.long).flatten().unique(sorted=True)
    if rows.numel() == 0:
        raise ValueError("sid_softmax names no SID rows: pass their token ids, or True / False / None")
    return rows


def kept_positions(kwargs: dict[str, Any], keep: int) -> int | torch.Tensor:
    """``logits_to_keep`` for the last ``keep`` positions of ``kwargs["input_ids"]``: their indices where some
    positions are left out. An int slices the hidden states without copying them, and the head's product of
    that strided slice takes a batched path whose bf16 kernel copies the whole head once per prompt on a CPU
    (BENCHMARKS.md, "Serving against the machine's limit"); indices gather a contiguous copy instead."""
    ids = kwargs.get("input_ids")
    if not keep or ids is None or ids.shape[-1] <= keep:
        return keep
    length = ids.shape[-1]
    return torch.arange(length - keep, length, device=ids.device)


class StepHead:
    """Logits of a decoding forward: the full head (``sid_ids=None``), or the columns of ``sid_ids`` only
    (sorted token ids; :meth:`columns` maps token ids to their column)."""

    def __init__(self, model: Any, sid_ids: torch.Tensor | None = None) -> None:
        self.sid_ids = sid_ids
        if sid_ids is None:
            return
        base = _transformers_model(model)
        if not supports_compact_head(base):
            raise ValueError(
                "sid_softmax=True reads the head's SID rows directly; this model scales or soft-caps its "
                "logits, which that skips. Decode it with sid_softmax=False."
            )
        self.backbone = base.base_model
        with torch.no_grad():
            weight, bias = head_rows(base, sid_ids)
        self.weight, self.bias = weight.detach(), None if bias is None else bias.detach()
        self.sid_ids = sid_ids.to(self.weight.device)

    @classmethod
    def for_model(cls, model: Any, sid_softmax: SIDSoftmax = None) -> StepHead:
        """The head ``model`` decodes with: its SID rows when it trained with the SID-only softmax."""
        return cls(model, sid_rows(model, sid_softmax))

    @property
    def width(self) -> int | None:
        """Columns of the logits (None: the model's whole vocabulary)."""
        return None if self.sid_ids is None else self.sid_ids.numel()

    def columns(self, tokens: torch.Tensor) -> torch.Tensor:
        """Each token id's column in the logits."""
        if self.sid_ids is None:
            return tokens
        column, inside = sid_columns(self.sid_ids.to(tokens.device), tokens)
        if not bool(inside.all()):
            raise ValueError(
                "a SID token of the catalogue is not among the adapter's SID rows: decode with the SID index "
                "the adapter was trained on, or with sid_softmax=False"
            )
        return column

    def check(self, trie: Any, vocab_size: int | None = None) -> None:
        """Fail clearly when a trie token has no column here."""
        if self.sid_ids is None:
            trie.check_vocab_size(vocab_size)
        else:
            self.columns(torch.tensor(trie.sid_tokens, device=self.sid_ids.device))

    def __call__(self, model: Any, keep: int, **kwargs: Any) -> tuple[torch.Tensor, Any]:
        """``(float logits of the last keep positions (0: all), model output)`` of ``model(**kwargs)`` with the
        KV cache on."""
        if self.sid_ids is None:
            output = model(**kwargs, use_cache=True, logits_to_keep=kept_positions(kwargs, keep))
            return output.logits.float(), output
        output = self.backbone(**kwargs, use_cache=True)
        hidden = output.last_hidden_state
        hidden = hidden[:, -keep:] if keep else hidden
        weight = self.weight.to(hidden.device, hidden.dtype)
        bias = None if self.bias is None else self.bias.to(hidden.device, hidden.dtype)
        return torch.nn.functional.linear(hidden, weight, bias).float(), output
