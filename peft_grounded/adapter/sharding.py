"""Sharded training (FSDP2, DeepSpeed ZeRO-3) of a grounded-token adapter.

The head (and every tied embedding) reads the rows the input embedding layer holds, which accelerate's FSDP2
preparation cannot see: it would shard the embedding apart from its readers (on a tied model torch refuses the
shared parameter). :func:`shard_grounded_layers` puts them in one unit first. Under FSDP's sharded state dict
and ZeRO-3, ``Trainer.save_model`` may write no adapter weights: :func:`gathered_trainable_state` gathers them.
"""

from __future__ import annotations

import torch
from torch import nn

from .layer import GroundedHead, GroundedTiedEmbedding, GroundedTokenLayer, wrapped_keys


def grounded_modules(model: nn.Module) -> list[nn.Module]:
    """The embedding layer holding the rows, then every module that reads them (head, tied embeddings)."""
    layers = [m for m in model.modules() if isinstance(m, GroundedTokenLayer)]
    readers = [m for m in model.modules() if isinstance(m, (GroundedHead, GroundedTiedEmbedding))]
    return layers + readers


def shard_grounded_layers(model: nn.Module, plugin, mesh=None) -> bool:
    """``fully_shard`` the grounded layers of ``model`` as one unit, kept unsharded from the embedding's forward
    to the head's, with the settings of ``plugin`` (accelerate's FSDP2 plugin) over ``mesh`` (None: all
    processes), before accelerate prepares ``model``. Returns whether it sharded anything."""
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    modules = grounded_modules(model)
    if not modules or any(isinstance(m, FSDPModule) for m in modules):
        return False
    if plugin.cpu_ram_efficient_loading:
        raise ValueError(
            "fsdp_cpu_ram_efficient_loading is not supported with a grounded-token adapter: accelerate would "
            "broadcast the first process's unsharded weights into the unit of the grounded rows, which is sharded "
            "before accelerate's preparation. Set fsdp_cpu_ram_efficient_loading: false in the accelerate config "
            "(every process then loads the base model, which the adapter needs anyway: docs/distributed.md)."
        )
    fully_shard(
        modules,
        reshard_after_forward=False,
        offload_policy=plugin.cpu_offload,
        mp_policy=plugin.mixed_precision_policy or MixedPrecisionPolicy(),
        mesh=mesh,
    )
    return True


def fsdp_mesh(accelerator):
    """The device mesh accelerate shards over (None: the default one over all processes), as it computes it."""
    mesh = getattr(accelerator, "torch_device_mesh", None)
    return None if mesh is None else mesh[tuple(accelerator.parallelism_config.fsdp_dim_names)]


def gathered_trainable_state(model: nn.Module, *, fsdp: bool, deepspeed: bool) -> dict[str, torch.Tensor]:
    """The trainable parameters of ``model`` at full size, on the CPU, keyed like ``model.state_dict()``.

    Collective under FSDP and ZeRO-3: every rank calls it. Under FSDP only the main process gets the tensors
    (the others get an empty dict); under DeepSpeed every rank does. Frozen weights are never gathered.
    """
    if fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
        with wrapped_keys():  # the state dict's names as named_parameters() gives them, as DCP expects
            return get_model_state_dict(model, options=options)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if deepspeed:
        import deepspeed as ds

        with ds.zero.GatheredParameters([p for _, p in named], modifier_rank=None):
            return {n: p.detach().cpu().clone() for n, p in named}
    return {n: p.detach().cpu().clone() for n, p in named}
