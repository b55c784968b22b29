"""The tuner layer: new-token rows as small trainable matrices over a frozen embedding and head.

``GroundedTokenLayer`` wraps the input embedding and holds each adapter's rows (``grounded_embedding``, and
``grounded_head`` for an untied head). ``GroundedHead`` stands in for the output layer and
``GroundedTiedEmbedding`` for every other embedding module on the same weight (T5's and BART's); both are plain
modules driven by the embedding layer, so one set of rows serves every reader. The head's ``weight`` has the
rows written in, differentiably, for losses that read ``lm_head.weight`` (TRL's), which refuse a tuner layer there.
"""

from __future__ import annotations

import contextlib
import contextvars
import warnings
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from peft.tuners._buffer_dict import BufferDict
from peft.tuners.tuners_utils import BaseTunerLayer, check_adapters_to_merge
from torch import nn


def _master(rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Trainable copy of ``rows`` on ``weight``'s device: float32 for half-precision bases (PEFT's default
    ``autocast_adapter_dtype=True``; :meth:`GroundedTokenLayer.cast_rows_to_base` serves False), else its dtype."""
    dtype = torch.float32 if weight.dtype in (torch.float16, torch.bfloat16) else weight.dtype
    return rows.detach().to(weight.device, dtype).clone()


def on_device_of(rows: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``rows`` on ``target``'s device and in its dtype, differentiably (a ``device_map`` may split them)."""
    return rows.to(target.device, target.dtype)


def is_offloaded(module: nn.Module) -> bool:
    """Whether accelerate loads ``module``'s weights only inside its forward (CPU/disk offload)."""
    return bool(getattr(getattr(module, "_hf_hook", None), "offload", False))


class GroundedTokenLayer(nn.Module, BaseTunerLayer):
    """Input embedding with trainable rows for the new tokens of each adapter."""

    adapter_layer_names = ("grounded_embedding", "grounded_head")
    other_param_names = ("grounded_indices", "grounded_original", "grounded_head_original")

    def __init__(self, base_layer: nn.Module, adapter_name: str, head: nn.Module | None = None) -> None:
        super().__init__()
        if not isinstance(getattr(base_layer, "weight", None), torch.Tensor) or base_layer.weight.ndim != 2:
            raise TypeError(
                f"The grounded-token adapter wraps an embedding with a 2-d `weight`; got {type(base_layer).__name__}."
                " Point `target_modules` at the input embedding."
            )
        self.base_layer = base_layer
        self.grounded_embedding = nn.ParameterDict()
        self.grounded_head = nn.ParameterDict()
        self.grounded_indices = BufferDict(persistent=False)
        self.grounded_original = BufferDict(persistent=False)
        self.grounded_head_original = BufferDict(persistent=False)
        self._head = [head]  # the model's own output layer: referenced, not owned (kept out of state_dict)
        self.num_embeddings = base_layer.weight.shape[0]
        self.in_features, self.out_features = base_layer.weight.shape  # rows, width: as PEFT's embeddings
        self._active_adapter = adapter_name
        self.merged_adapters: list[str] = []
        self._lookup: dict[tuple[str, torch.device], torch.Tensor] = {}

    # --- structure -------------------------------------------------------------------------------------

    @property
    def head(self) -> nn.Module | None:
        return self._head[0]

    @property
    def tied(self) -> bool:
        head = self.head
        return head is not None and head.weight is self.base_layer.weight

    def update_layer(
        self,
        adapter_name: str,
        token_indices: list[int],
        input_rows: torch.Tensor,
        output_rows: torch.Tensor | None,
    ) -> None:
        """Add an adapter whose new tokens ``token_indices`` start from ``input_rows`` (and ``output_rows``)."""
        weight = self.base_layer.weight
        index = torch.as_tensor(token_indices, dtype=torch.long, device=weight.device)
        self.grounded_indices[adapter_name] = index
        self.grounded_original[adapter_name] = weight.detach()[index].clone()
        self.grounded_embedding[adapter_name] = nn.Parameter(_master(input_rows, weight))
        if output_rows is not None:
            head_weight = self.head.weight
            self.grounded_head_original[adapter_name] = head_weight.detach()[index].clone()
            self.grounded_head[adapter_name] = nn.Parameter(_master(output_rows, head_weight))
        self._lookup.clear()
        self.set_adapter(self.active_adapters)

    def cast_rows_to_base(self, adapter_name: str) -> None:
        """Keep the adapter's rows in the dtype of the matrices they overlay (``autocast_adapter_dtype=False``)."""
        for rows, weight in (
            (self.grounded_embedding, self.base_layer.weight),
            (self.grounded_head, None if self.head is None else self.head.weight),
        ):
            if adapter_name in rows and weight is not None and rows[adapter_name].dtype != weight.dtype:
                old = rows[adapter_name]
                rows[adapter_name] = nn.Parameter(
                    old.detach().to(weight.dtype), requires_grad=old.requires_grad
                )

    def delete_adapter(self, adapter_name: str) -> None:
        super().delete_adapter(adapter_name)
        self._lookup.clear()

    def _check_disjoint(self, adapter_names: list[str]) -> None:
        """Adapters used together (active or merged) must cover disjoint tokens."""
        names = list(dict.fromkeys(self.merged_adapters + adapter_names))
        seen: dict[int, str] = {}
        for name in names:
            for token in self.grounded_indices[name].tolist():
                other = seen.setdefault(token, name)
                if other != name:
                    raise ValueError(
                        f"Adapters {other!r} and {name!r} both own token row {token}; grounded adapters used together "
                        "must cover disjoint tokens. Activate one of them at a time (set_adapter)."
                    )

    def _check_size(self) -> None:
        rows = self.base_layer.weight.shape[0]
        if rows != self.num_embeddings:
            raise RuntimeError(
                f"The input embedding was resized from {self.num_embeddings} to {rows} rows after the grounded-token "
                "adapter wrapped it, which would misplace the adapter's rows. Add tokens and resize first "
                "(peft_grounded.add_tokens), then call get_peft_model; to extend an adapted model, "
                "merge_and_unload() it, add the tokens, and wrap it again."
            )

    def _local_index(self, adapter_name: str, device: torch.device) -> torch.Tensor:
        """Map from token id to the adapter's row (-1 for tokens the adapter does not own), cached per device."""
        key = (adapter_name, device)
        lookup = self._lookup.get(key)
        if lookup is None:
            lookup = torch.full((self.num_embeddings,), -1, dtype=torch.long, device=device)
            index = self.grounded_indices[adapter_name].to(device)
            lookup[index] = torch.arange(index.numel(), device=device)
            self._lookup[key] = lookup
        return lookup

    def _output_rows(self) -> list[tuple[str, torch.Tensor]]:
        """``(adapter, output rows)`` of the adapters in effect that have them (a tied head's are the input's)."""
        found = []  # a plain loop: torch.compile(fullgraph=True) cannot trace a walrus in a comprehension
        for name in self._adapters_in_effect():
            rows = self.grounded_embedding[name] if self.tied else self.grounded_head.get(name)
            if rows is not None:
                found.append((name, rows))
        return found

    def _adapters_in_effect(self) -> list[str]:
        if self.disable_adapters or self.merged:
            return []
        names = [name for name in self.active_adapters if name in self.grounded_embedding]
        if len(names) > 1:
            self._check_disjoint(names)
        return names

    # --- forward -----------------------------------------------------------------------------------------

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return self.embed(self.base_layer, x, *args, **kwargs)

    def embed(self, base: nn.Module, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        """``base(x)`` (an embedding on this layer's weight) with the new tokens' positions taken from the rows."""
        self._check_size()
        if self.disable_adapters and self.merged:
            self.unmerge()
        result = base(x, *args, **kwargs)
        names = self._adapters_in_effect()
        if not names:
            return result
        scale = _embed_scale(base)
        for name in names:
            local = self._local_index(name, result.device)[x.to(result.device)]
            rows = F.embedding(local.clamp(min=0), on_device_of(self.grounded_embedding[name], result))
            if scale is not None:
                rows = rows * scale.to(rows.device, rows.dtype)
            result = torch.where((local >= 0).unsqueeze(-1), rows, result)
        return result

    def head_forward(self, head: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of the frozen head with the new tokens' columns computed from the adapter rows."""
        self._check_size()
        pairs = [(self.grounded_indices[name], rows) for name, rows in self._output_rows()]
        if not pairs:
            return head(hidden)
        weight, bias = head.weight, getattr(head, "bias", None)
        # An offloaded head gets its weight, and the hidden states, inside its forward (accelerate); any other
        # computes where its weight lives (a device_map may split the model; `.to` is differentiable).
        offloaded = is_offloaded(head)
        if not offloaded:
            hidden = hidden.to(weight.device)
        if (
            isinstance(head, nn.Linear)
            and not weight.requires_grad
            and (bias is None or not bias.requires_grad)
            and not offloaded
        ):
            index = torch.cat([i.to(weight.device) for i, _ in pairs])
            rows = torch.cat([r.to(weight.device) for _, r in pairs])
            return _OverlayColumns.apply(hidden, weight, bias, rows, index)
        logits = head(hidden)  # a trainable, offloaded or unusual head: plain autograd, on the logits' device
        device = logits.device
        index = torch.cat([i.to(device) for i, _ in pairs])
        rows = torch.cat([r.to(device) for _, r in pairs])
        hidden = hidden.to(device)
        new = F.linear(
            hidden, rows.to(hidden.dtype), None if bias is None else bias.to(device)[index].to(hidden.dtype)
        )
        return logits.index_copy(-1, index, new.to(logits.dtype))

    def head_weight(self, head: nn.Module) -> torch.Tensor:
        """The head's weight with the adapter rows written in (differentiable w.r.t. those rows); outside the
        forward of a model sharded by FSDP2, the head's own sharded weight (a ``DTensor``), as for any parameter."""
        weight = head.weight
        if type(weight).__name__ == "DTensor":
            return weight
        for name, rows in self._output_rows():
            index = self.grounded_indices[name].to(weight.device)
            weight = weight.index_copy(0, index, on_device_of(rows, weight))
        return weight

    def head_rows(self, head: nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(weight[ids], bias[ids])`` of the head with the adapter rows written in (differentiable w.r.t.
        those rows): what a softmax over the rows ``ids`` only needs, without the full head weight."""
        self._check_size()
        weight, bias = head.weight, getattr(head, "bias", None)
        ids = ids.to(weight.device)
        rows = weight[ids]
        for name, adapter in self._output_rows():
            local = self._local_index(name, weight.device)[ids]
            new = F.embedding(local.clamp(min=0), on_device_of(adapter, rows))
            rows = torch.where((local >= 0).unsqueeze(-1), new, rows.to(new.dtype))
        return rows, None if bias is None else bias[ids]

    # --- merge ---------------------------------------------------------------------------------------------

    def merge(self, safe_merge: bool = False, adapter_names: list[str] | None = None) -> None:
        """Write the adapter rows into the base matrices in place (tying is preserved)."""
        adapter_names = [
            n for n in check_adapters_to_merge(self, adapter_names) if n in self.grounded_embedding
        ]
        self._check_disjoint(adapter_names)
        merges = []
        for name in adapter_names:
            pairs = [(self.base_layer.weight, self.grounded_embedding[name])]
            if not self.tied and name in self.grounded_head:
                pairs.append((self.head.weight, self.grounded_head[name]))
            written = [(weight, on_device_of(rows.detach(), weight)) for weight, rows in pairs]
            if safe_merge and not all(torch.isfinite(v).all() for _, v in written):
                raise ValueError(  # PEFT's own words, which callers match
                    f"NaNs detected in the merged weights. The adapter {name} seems to be broken "
                    "(its rows hold NaN or Inf); nothing was merged."
                )
            merges.append((name, written))
        for name, written in merges:  # every check first: a refused merge leaves the base as it was
            for weight, values in written:
                weight.data.index_copy_(0, self.grounded_indices[name].to(weight.device), values)
            self.merged_adapters.append(name)

    def unmerge(self) -> None:
        """Restore the base rows exactly as they were when the adapter was added."""
        if not self.merged:
            warnings.warn("Already unmerged. Nothing to do.", stacklevel=2)
            return
        while self.merged_adapters:
            name = self.merged_adapters.pop()
            index = self.grounded_indices[name]
            pairs = [(self.base_layer.weight, self.grounded_original[name])]
            if not self.tied and name in self.grounded_head_original:
                pairs.append((self.head.weight, self.grounded_head_original[name]))
            for weight, original in pairs:  # PEFT upcasts these buffers to float32 on half-precision bases
                weight.data.index_copy_(0, index.to(weight.device), original.to(weight.device, weight.dtype))


class _OverlayColumns(torch.autograd.Function):
    """``hidden @ weight.T + bias`` with the columns ``index`` computed from ``rows`` instead of ``weight``; the
    backward corrects the hidden-state gradient for those columns rather than copying the full logits gradient."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, rows, index):
        logits = F.linear(hidden, weight, bias)
        new = F.linear(hidden, rows.to(logits.dtype), None if bias is None else bias[index].to(logits.dtype))
        logits.index_copy_(-1, index, new.to(logits.dtype))
        ctx.save_for_backward(hidden, weight, rows, index)
        return logits

    @staticmethod
    def backward(ctx, grad):
        hidden, weight, rows, index = ctx.saved_tensors
        columns = grad.index_select(-1, index)
        frozen = weight.to(grad.dtype)
        grad_hidden = grad @ frozen + columns @ (rows.to(grad.dtype) - frozen[index])
        grad_rows = columns.reshape(-1, index.numel()).T @ hidden.reshape(-1, hidden.shape[-1]).to(grad.dtype)
        return grad_hidden.to(hidden.dtype), None, None, grad_rows.to(rows.dtype), None


def _embed_scale(base: nn.Module) -> torch.Tensor | None:
    """The scalar an embedding module multiplies its lookups by (``embed_scale``: BART, Gemma), if any."""
    scale = getattr(base, "embed_scale", None)
    if isinstance(scale, (int, float)):
        return torch.tensor(scale, device=base.weight.device, dtype=base.weight.dtype)
    if isinstance(scale, torch.Tensor) and scale.numel() == 1:
        return scale
    if scale is None:
        return None
    raise TypeError(
        f"{type(base).__name__}.embed_scale is not a scalar ({scale!r}): the adapter rows cannot be scaled like "
        "the frozen rows, so this embedding is not supported."
    )


class _OwnedView(nn.Module):
    """A stand-in for a module on the embedding's weight, driven by the owning :class:`GroundedTokenLayer`: a plain
    module without parameters of its own, which PEFT neither counts nor saves, and unloading puts back."""

    def __init__(self, base_layer: nn.Module, owner: GroundedTokenLayer) -> None:
        super().__init__()
        self.base_layer = base_layer
        self._owner = [owner]  # referenced, not a submodule: its parameters belong to the embedding
        # the base's keys (`lm_head.weight`), as PEFT gives them for its tuner layers
        self.register_state_dict_post_hook(_base_keys)
        self.register_load_state_dict_pre_hook(_wrapped_keys)

    @property
    def owner(self) -> GroundedTokenLayer:
        return self._owner[0]

    def __setattr__(self, name: str, value) -> None:
        if name == "weight":  # transformers' tie_weights assigns the head weight
            self.base_layer.weight = value
            return
        super().__setattr__(name, value)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "base_layer":
                raise
            return getattr(self.base_layer, name)  # in_features, out_features, ...

    def get_base_layer(self) -> nn.Module:
        return self.base_layer

    def merge(self, safe_merge: bool = False, adapter_names: list[str] | None = None) -> None:
        """No-op: the owning embedding layer merges its rows into the shared matrices."""


def _base_keys(module: nn.Module, state_dict: dict, prefix: str, local_metadata: dict) -> None:
    """State-dict post-hook of an owned view: ``<prefix>base_layer.<name>`` becomes ``<prefix><name>``, unless
    :func:`wrapped_keys` asks for the module's own names."""
    if _WRAPPED_KEYS.get():
        return
    inner = f"{prefix}base_layer."
    for key in [k for k in state_dict if k.startswith(inner)]:
        state_dict[prefix + key[len(inner) :]] = state_dict.pop(key)


def _wrapped_keys(module: nn.Module, state_dict: dict, prefix: str, *args) -> None:
    """Load-state-dict pre-hook of an owned view: the base's keys (``<prefix>weight``) load into its base layer;
    keys that already name ``base_layer`` are left as they are."""
    names = {f"{prefix}{name}" for name, _ in module.base_layer.named_parameters()}
    names |= {f"{prefix}{name}" for name, _ in module.base_layer.named_buffers()}
    for key in [k for k in state_dict if k in names]:
        state_dict[f"{prefix}base_layer.{key[len(prefix) :]}"] = state_dict.pop(key)


_WRAPPED_KEYS: contextvars.ContextVar[bool] = contextvars.ContextVar("grounded_wrapped_keys", default=False)


@contextlib.contextmanager
def wrapped_keys() -> Iterator[None]:
    """Within the block, ``state_dict()`` names the head's weight ``lm_head.base_layer.weight``, as
    ``named_parameters()`` does: for code that pairs the two (torch's distributed checkpoint state dicts)."""
    token = _WRAPPED_KEYS.set(True)
    try:
        yield
    finally:
        _WRAPPED_KEYS.reset(token)


class GroundedHead(_OwnedView):
    """Stand-in for the output layer; the embedding's :class:`GroundedTokenLayer` supplies the new rows."""

    @property
    def weight(self) -> torch.Tensor:
        return self.owner.head_weight(self.base_layer)

    @property
    def bias(self) -> torch.Tensor | None:
        return getattr(self.base_layer, "bias", None)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.owner.head_forward(self.base_layer, hidden)

    def rows(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The head's ``(weight[ids], bias[ids])``, adapter rows included (see :meth:`GroundedTokenLayer.head_rows`)."""
        return self.owner.head_rows(self.base_layer, ids)


class GroundedTiedEmbedding(_OwnedView):
    """Stand-in for another embedding module on the owner's weight (T5/BART ``encoder.embed_tokens``, ...)."""

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return self.owner.embed(self.base_layer, x, *args, **kwargs)
