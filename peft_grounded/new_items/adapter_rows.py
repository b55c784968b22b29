"""Grow a trained grounded adapter onto a grown SID index (new items without retraining).

:func:`grow_adapter` takes a model carrying an adapter trained on ``parent_index`` and returns one for
``child_index`` (made by :meth:`SIDIndex.add_items`): the child's new tokens are added to the tokenizer
and the model, the adapter gets rows for them (centroid init by default, from the child's centroids,
through the same projection machinery as ``GroundedTokenConfig``), and every trained row and every
LoRA weight is carried over bit for bit. The result saves, reloads and merges like any grounded adapter;
its config records the child's fingerprint (``sid_index_fingerprint``).

Below it, what saving a grown adapter into a folder needs (the ``grow-adapter`` command,
:func:`peft_grounded.cli.growth.grow_adapter_into`): which folder may receive it, and a save that replaces
only the adapter's own files there.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .._io import PEFT_CARD_MARKER, is_generated_card, replace_keeping_others
from .._quiet import peft_wrapping
from ..adapter.config import GroundedRuntimeConfig, GroundedTokenConfig
from ..adapter.initialize import add_tokens, check_tokenizer, initializer_range
from ..adapter.layer import GroundedTokenLayer
from ..adapter.starts import InitData, initial_rows
from ..hub.repo import FUSION_FILES, RULE_FILES
from ..sids.extended_base import FINGERPRINT_KEY, record_sid_facts, sid_record

if TYPE_CHECKING:
    from peft import PeftModel

    from ..sids.index import SIDIndex


GROW_INITS = ("centroid", "mean", "gaussian", "random", "tensor", "description")


def check_lineage(parent_index: SIDIndex, child_index: SIDIndex) -> list[str]:
    """The child's new token strings; raises unless the child grew from the parent (tokens extend it)."""
    parent_fp = parent_index.fingerprint()
    if parent_fp not in child_index.lineage:
        raise ValueError(
            f"The SID index {child_index.fingerprint()} did not grow from {parent_fp} (its lineage is "
            f"{child_index.lineage or 'empty: a fresh build'}); pass the index it was made from with add_items."
        )
    parent_tokens = parent_index.token_strings
    if child_index.token_strings[: len(parent_tokens)] != parent_tokens:
        raise ValueError(
            "The child index's tokens do not extend the parent's in order; it cannot carry the adapter."
        )
    if child_index.codes[: parent_index.n_items].tolist() != parent_index.codes.tolist():
        raise ValueError(
            "The child index changed SIDs of the parent's items; its tokens would mean other items."
        )
    return child_index.token_strings[len(parent_tokens) :]


def _new_rows(
    init: str,
    weight: torch.Tensor,
    config: GroundedTokenConfig,
    old_ids: Sequence[int],
    new_ids: Sequence[int],
    child_index: SIDIndex,
    centroid_variant: str,
    init_vectors: Any,
    token_id_lists: list[list[int]] | None,
    seed: int,
    initializer_range: float,
) -> torch.Tensor:
    reference = slice(0, config.base_vocab_size)
    if init == "centroid":  # projected together with the parent's tokens, so the new rows share their frame
        _, vectors = child_index.adapter_init(centroid_variant)
        data = InitData(vectors=vectors, projection=config.centroid_projection, norm_match=config.norm_match)
        rows = initial_rows(
            "centroid", weight, [*old_ids, *new_ids], reference, data, seed=seed, scale=config.init_scale
        )
        return rows[len(old_ids) :]
    data = InitData(
        vectors=None if init_vectors is None else torch.as_tensor(init_vectors, dtype=torch.float32),
        token_id_lists=token_id_lists,
    )
    return initial_rows(
        init,
        weight,
        list(new_ids),
        reference,
        data,
        seed=seed,
        initializer_range=initializer_range,
        scale=config.init_scale,
    )


def grow_adapter(
    model: PeftModel,
    tokenizer: Any,
    parent_index: SIDIndex,
    child_index: SIDIndex,
    *,
    init: str = "centroid",
    centroid_variant: str = "items",
    init_vectors: Any = None,
    init_texts: Sequence[str] | None = None,
    adapter_name: str | None = None,
) -> PeftModel:
    """The adapter of ``model`` (trained on ``parent_index``) grown onto ``child_index``; returns a new
    ``PeftModel`` over the same base, with the child's new tokens added to ``tokenizer`` and the model.

    ``init``: how the new tokens' rows start: ``"centroid"`` (default; the child's ``centroid_variant``
    centroids, projected with the parent's tokens), ``"mean"``, ``"gaussian"``, ``"random"``, ``"tensor"``
    (``init_vectors``: ``[n_new, d_model]``) or ``"description"`` (``init_texts``: one text per new token).
    Trained rows and LoRA weights are copied exactly. ``model`` is unwrapped in the process (like
    ``merge_and_unload``): use the returned model. Nothing is changed when a check fails.
    """
    from peft import get_peft_model

    if init not in GROW_INITS:
        raise ValueError(f"init must be one of {', '.join(GROW_INITS)}, got {init!r}")
    name = adapter_name or model.active_adapter
    config = model.peft_config.get(name)
    if not isinstance(config, GroundedTokenConfig):
        raise TypeError(f"Adapter {name!r} is not a grounded-token adapter.")
    if len(model.peft_config) > 1:
        raise ValueError(
            "grow_adapter grows a model carrying one adapter; delete the others (delete_adapter) first."
        )
    layer = model.get_input_embeddings()
    if not isinstance(layer, GroundedTokenLayer) or name not in layer.grounded_embedding:
        raise ValueError(f"Adapter {name!r} has no grounded rows on the input embedding.")
    if layer.merged:
        raise ValueError("The adapter is merged; unmerge it (model.unmerge_adapter()) before growing it.")
    if config.token_strings is None:
        raise ValueError("The adapter does not record its token strings; it cannot be matched to an index.")
    parent_index.check_adapter(config, recorded=sid_record(model, name).get(FINGERPRINT_KEY))
    new_tokens = check_lineage(parent_index, child_index)
    check_tokenizer(config, tokenizer)
    if init == "tensor" and (init_vectors is None or len(init_vectors) != len(new_tokens)):
        raise ValueError(f"init='tensor' needs init_vectors with one row per new token ({len(new_tokens)}).")
    if init == "description" and (init_texts is None or len(init_texts) != len(new_tokens)):
        raise ValueError(
            f"init='description' needs init_texts with one text per new token ({len(new_tokens)})."
        )
    present = [t for t in new_tokens if t in tokenizer.get_vocab()]
    if present:
        raise ValueError(f"The tokenizer already has {len(present)} of the new tokens (e.g. {present[0]!r}).")

    rows_in = layer.grounded_embedding[name].detach().clone()
    head_rows = layer.grounded_head.get(name)
    rows_out = None if head_rows is None else head_rows.detach().clone()
    lora = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    old_ids = list(config.token_indices)

    base = model.unload()
    for attribute in ("peft_config", "_hf_peft_config_loaded"):
        base.__dict__.pop(attribute, None)
    new_ids: list[int] = []
    if new_tokens:
        new_ids = list(add_tokens(tokenizer, base, new_tokens))
        token_lists = None
        if init == "description":
            token_lists = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in init_texts or []]
        weights = {"input": base.get_input_embeddings().weight}
        if rows_out is not None:
            weights["output"] = base.get_output_embeddings().weight
        grown: dict[str, torch.Tensor] = {}
        for matrix, weight in weights.items():
            fresh = _new_rows(
                init,
                weight,
                config,
                old_ids,
                new_ids,
                child_index,
                centroid_variant,
                init_vectors,
                token_lists,
                config.init_seed + (0 if matrix == "input" else 1),
                initializer_range(base),
            )
            trained = rows_in if matrix == "input" else rows_out
            grown[matrix] = torch.cat([trained.to(torch.float32), fresh.to(trained.device, torch.float32)])
    else:
        grown = {"input": rows_in.to(torch.float32)}
        if rows_out is not None:
            grown["output"] = rows_out.to(torch.float32)

    child_config = copy.deepcopy(config)
    child_config.token_indices = [*old_ids, *new_ids]
    child_config.token_strings = list(child_index.token_strings)
    child_config.init = "tensor"
    child_config.init_weights = True
    child_config.init_scale = 1.0  # the grown rows are given as they are (the new ones already scaled)
    child_config.runtime_config = GroundedRuntimeConfig(
        init_vectors=grown if "output" in grown else grown["input"]
    )
    if child_config.provenance is not None:
        child_config.provenance = replace(child_config.provenance, num_embeddings=None, init_data=None)
    child_config.inference_mode = False
    # PEFT renames the config's base to the model's own name (and warns when they differ): give it that name,
    # then keep the parent's record of its base, which loads the grown adapter as it loaded the parent
    child_config.base_model_name_or_path = base.__dict__.get("name_or_path") or None
    with peft_wrapping():
        grown_model = get_peft_model(base, child_config, adapter_name=name)
    grown_model.peft_config[name].base_model_name_or_path = (
        config.base_model_name_or_path or grown_model.peft_config[name].base_model_name_or_path
    )
    record_sid_facts(
        grown_model, name, **{**sid_record(model, name), FINGERPRINT_KEY: child_index.fingerprint()}
    )
    params = dict(grown_model.named_parameters())
    missing = sorted(set(lora) - set(params))
    if missing:
        raise RuntimeError(f"The grown model lacks LoRA weights of the adapter (e.g. {missing[0]}).")
    with torch.no_grad():
        for key, value in lora.items():
            params[key].copy_(value)
    return grown_model


# Saving a grown adapter into a folder (the ``grow-adapter`` command), replacing only what the adapter owns
# there.

ADAPTER_CONFIG = "adapter_config.json"  # what PEFT's save_pretrained writes first
ADAPTER_FILES = (  # an adapter's own files (its new-item rule and peer fusion: fitted for its index)
    ADAPTER_CONFIG,
    "adapter_model.safetensors",
    "adapter_model.bin",
    *RULE_FILES,
    *FUSION_FILES,
)


def check_output(output: Path, adapter: Path, overwrite: bool) -> None:
    """Raise ``ValueError`` unless ``output`` may receive the grown adapter (before anything is loaded)."""
    if output.resolve() == adapter.resolve():
        raise ValueError(
            f"--output_dir is the trained adapter's directory ({adapter}); write the grown adapter elsewhere "
            "(the trained one stays loadable with the parent index)"
        )
    if not output.exists():
        return
    if not output.is_dir():
        raise ValueError(f"--output_dir {output} is a file, not a directory; choose another --output_dir")
    if (output / ADAPTER_CONFIG).is_file():
        if not overwrite:
            raise ValueError(
                f"{output} already holds an adapter; choose another --output_dir, or pass --overwrite to "
                "replace it (its other files are kept)"
            )
    elif any(output.iterdir()):
        raise ValueError(
            f"{output} holds files but no adapter, and writing there would replace them; choose a new or "
            "empty --output_dir"
        )


def owned_by_adapter(path: Path) -> bool:
    """Whether ``path`` in an adapter folder is the adapter's own (replaced by a new save): its config,
    weights, new-item rule, peer fusion and PEFT's model card; anything else (a README of the user's, notes,
    data) is kept."""
    from ..sids.extended_base import SID_RECORD

    if path.name in ADAPTER_FILES or path.name == SID_RECORD:
        return True
    return path.name == "README.md" and is_generated_card(path, PEFT_CARD_MARKER)


def save_adapter_keeping_others(model, output: Path) -> list[str]:
    """Save ``model``'s adapter into ``output`` through a temporary sibling folder, carrying over the files
    of ``output`` the adapter does not own; returns their names."""
    import shutil

    from .._io import DiskFullError, is_disk_full, make_temp_dir

    tmp = make_temp_dir(output)
    try:
        from ..sids.extended_base import save_sid_record

        model.save_pretrained(tmp)
        save_sid_record(model, tmp)
        return replace_keeping_others(tmp, output, owned_by_adapter)
    except Exception as err:
        if is_disk_full(err):
            raise DiskFullError(
                f"no space to write the adapter {output} ({err}); it was left as it was. Free disk space, then "
                "run the command again",
                err,
            ) from err
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
