"""Incremental grounding: GTI pairs of the new items only, training only the rows their SIDs use.

After :func:`~peft_grounded.growth.grow_adapter`, :func:`ground_new_items` runs a few AdamW steps on
the grounding pairs (text -> SID, SID -> text) of the items the child index added. Every other weight
is frozen, and a gradient mask keeps every row outside ``rows`` bit-identical (a zero gradient from
the first step gives AdamW a zero update): ``rows="used"`` trains the rows of every token a new item's
SID uses (shared prefixes included), ``rows="new"`` only the tokens the child added. A stacked LoRA
is left as it is. Seconds on a CPU for a few hundred items, not a rerun.

``replay`` mixes in the pairs of a seeded sample of the parent's items (``replay`` old items per new
one). They train the same rows only, but they keep those rows calibrated: on the new items' pairs
alone, the shared rows learn that "a SID" means "a new item", and the recommender then gives new
items far more of its slots than their share of the targets.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ..grounding.data import GroundingData, grounding_examples

if TYPE_CHECKING:
    from ..sids.index import SIDIndex


@dataclass
class _NewItemsView:
    """The part of a SID index :func:`grounding_examples` reads, restricted to some items."""

    index: SIDIndex
    item_ids: list[str]

    def sid_text(self, item_id: str) -> str:
        return self.index.sid_text(item_id)


@dataclass
class IncrementalResult:
    """What :func:`ground_new_items` did."""

    n_items: int
    n_examples: int  # new items' pairs and replayed old items' pairs together
    trained_rows: list[int]  # adapter rows (positions in the token list) that could move
    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0
    n_replayed: int = 0  # old items whose pairs were mixed in


def new_item_ids(parent_index: SIDIndex, child_index: SIDIndex) -> list[str]:
    """The items the child added to the parent (in the child's order)."""
    return list(child_index.item_ids[parent_index.n_items :])


def rows_used(child_index: SIDIndex, item_ids: Sequence[str]) -> list[int]:
    """Token rows (positions in ``child_index.token_strings``) that the SIDs of ``item_ids`` use."""
    offsets = [child_index.token_offset(level) for level in range(child_index.n_levels)]
    rows = {offsets[lv] + code for item in item_ids for lv, code in enumerate(child_index.sid_of(item))}
    return sorted(rows)


def _encode(tokenizer: Any, rows: list[dict], chat: bool) -> list[tuple[list[int], list[int]]]:
    out = []
    for row in rows:
        if chat:
            prompt = tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
            full = tokenizer.apply_chat_template(row["prompt"] + row["completion"], tokenize=False)
            completion = full[len(prompt) :] if full.startswith(prompt) else row["completion"][0]["content"]
        else:
            prompt, completion = row["prompt"], row["completion"]
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        c = tokenizer(completion, add_special_tokens=False)["input_ids"]
        out.append((p, c))
    return out


def _batch(
    pairs: list[tuple[list[int], list[int]]], pad: int, device: torch.device
) -> dict[str, torch.Tensor]:
    from torch.nn.utils.rnn import pad_sequence

    def padded(rows: list[list[int]], value: int) -> torch.Tensor:
        return pad_sequence(
            [torch.tensor(r, dtype=torch.long) for r in rows], batch_first=True, padding_value=value
        )

    ids = padded([p + c for p, c in pairs], pad)
    labels = padded([[-100] * len(p) + c for p, c in pairs], -100)  # the completion only
    mask = padded([[1] * (len(p) + len(c)) for p, c in pairs], 0)
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device), "labels": labels.to(device)}


def check_settings(
    *,
    rows: str = "used",
    replay: float = 1.0,
    steps: int = 30,
    learning_rate: float = 1e-3,
    batch_size: int = 8,
    seed: int = 0,
) -> None:
    """Refuse :func:`ground_new_items` settings out of range (entry points call it before loading a model)."""
    from .. import checks

    checks.raise_problems(
        "incremental grounding",
        [
            checks.one_of("rows", rows, ("used", "new"), flag="--rows"),
            None
            if checks.is_number(replay) and replay >= 0
            else f"replay must be >= 0 (old items per new item; 0: the new items alone), got {replay!r} (--replay)",
            checks.int_at_least("steps", steps, 0, flag="--ground-steps; 0: count the pairs, take no step"),
            checks.number_in("learning_rate", learning_rate, 0, low_open=True, flag="--lr"),
            checks.int_at_least("batch_size", batch_size, 1, flag="--batch-size"),
            checks.seed("seed", seed, flag="--seed"),
        ],
    )


def ground_new_items(
    model: Any,
    tokenizer: Any,
    parent_index: SIDIndex,
    child_index: SIDIndex,
    catalogue: Any,
    *,
    rows: str = "used",
    replay: float = 1.0,
    steps: int = 30,
    learning_rate: float = 1e-3,
    batch_size: int = 8,
    seed: int = 0,
    data: GroundingData | None = None,
    chat: bool | None = None,
    adapter_name: str | None = None,
) -> IncrementalResult:
    """Ground the rows of the child's new items in place (see the module doc); returns the losses.

    ``model``: the grown ``PeftModel`` (its adapter must record ``child_index``). ``catalogue``: a
    :class:`~peft_grounded.sids.Catalogue` (or anything with ``.items``) holding the new items' text, and
    the old items' text that ``replay`` samples from. ``replay``: old items per new item whose pairs are
    mixed in (0: the new items alone).
    """
    check_settings(
        rows=rows, replay=replay, steps=steps, learning_rate=learning_rate, batch_size=batch_size, seed=seed
    )
    name = adapter_name or model.active_adapter
    config = model.peft_config[name]
    child_index.check_adapter(config)
    new_ids = new_item_ids(parent_index, child_index)
    if not new_ids:
        raise ValueError("the child index adds no items to the parent: nothing to ground")
    if rows == "used":
        train_rows = rows_used(child_index, new_ids)
    else:
        train_rows = list(range(parent_index.n_tokens, child_index.n_tokens))
    if chat is None:
        chat = getattr(tokenizer, "chat_template", None) is not None
    old_ids = [i for i in parent_index.item_ids if i in catalogue.items]
    n_old = min(len(old_ids), round(replay * len(new_ids)))
    if replay and not old_ids:
        raise ValueError(
            "replay needs the text of some of the parent's items, and the catalogue holds none of them: pass "
            "the whole catalogue (old and new items), or replay=0 to ground on the new items alone"
        )
    replayed = random.Random(seed).sample(old_ids, n_old) if n_old else []
    examples = grounding_examples(catalogue, _NewItemsView(child_index, new_ids + replayed), data, chat=chat)
    pairs = _encode(tokenizer, examples, chat)
    layer = model.get_input_embeddings()
    params = [layer.grounded_embedding[name]]
    if name in layer.grounded_head:
        params.append(layer.grounded_head[name])
    mask = torch.zeros(params[0].shape[0], 1, dtype=params[0].dtype, device=params[0].device)
    mask[torch.as_tensor(train_rows, device=mask.device)] = 1.0
    states = {p: p.requires_grad for p in model.parameters()}
    was_training = model.training
    handles = []
    try:
        for p in model.parameters():
            p.requires_grad_(False)
        for p in params:
            p.requires_grad_(True)
            handles.append(p.register_hook(lambda grad: grad * mask.to(grad.dtype)))
        optimizer = torch.optim.AdamW(params, lr=learning_rate, weight_decay=0.0)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        device = params[0].device
        order = list(range(len(pairs)))
        rng = random.Random(seed)
        losses: list[float] = []
        start = time.perf_counter()
        model.train()
        cursor = len(order)
        for _ in range(steps):
            if cursor + batch_size > len(order):
                rng.shuffle(order)
                cursor = 0
            chosen = [pairs[i] for i in order[cursor : cursor + batch_size]]
            cursor += batch_size
            loss = model(**_batch(chosen, pad, device)).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
        seconds = time.perf_counter() - start
    finally:
        for handle in handles:
            handle.remove()
        for p, flag in states.items():
            p.requires_grad_(flag)
        model.train(was_training)
    return IncrementalResult(
        n_items=len(new_ids),
        n_examples=len(pairs),
        trained_rows=train_rows,
        losses=losses,
        seconds=seconds,
        n_replayed=len(replayed),
    )
