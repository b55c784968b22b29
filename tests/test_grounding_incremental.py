"""Incremental grounding of the new items: only the masked rows move, the rest stays bit-identical."""

from __future__ import annotations

import pytest
import torch
from helpers.growth_fixtures import grown_indices, trained

from peft_grounded.new_items import ground_new_items, grow_adapter, rows_used
from peft_grounded.sids import Catalogue, Item


def _catalogue(item_ids):
    return Catalogue("films", {i: Item(i, title=f"A film {i}", description="Fresh.") for i in item_ids})


@pytest.mark.parametrize(
    ("tied", "lora", "rows", "replay"), [(True, False, "used", 0.0), (False, True, "new", 2.0)]
)
def test_only_the_new_items_rows_train(tokenizer, tiny_model_factory, tied, lora, rows, replay):
    parent, child = grown_indices()
    model = trained(tokenizer, tiny_model_factory, parent, "llama", tied, lora)
    grown = grow_adapter(model, tokenizer, parent, child)
    # replay samples old items from the catalogue: with replay 0 it need only hold the new ones
    catalogue = _catalogue(child.item_ids if replay else child.item_ids[16:])
    layer = grown.get_input_embeddings()
    # the new items alone, no step taken: counts their pairs so the replayed ones can be counted
    alone = ground_new_items(grown, tokenizer, parent, child, catalogue, replay=0.0, max_steps=0)
    before = {n: p.detach().clone() for n, p in grown.named_parameters()}
    flags = {n: p.requires_grad for n, p in grown.named_parameters()}
    result = ground_new_items(
        grown,
        tokenizer,
        parent,
        child,
        catalogue,
        rows=rows,
        replay=replay,
        max_steps=6,
        learning_rate=1e-2,
        per_device_train_batch_size=int(
            alone.n_examples * (1 + replay)
        ),  # the full batch: losses comparable step to step
    )
    expected = (
        rows_used(child, child.item_ids[16:])
        if rows == "used"
        else list(range(parent.n_tokens, child.n_tokens))
    )
    assert result.trained_rows == expected and result.n_items == 3 and result.n_replayed == 3 * replay
    assert result.n_examples == alone.n_examples * (1 + replay)  # each item gives the same pair count
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


def test_replay_needs_old_items_text(tokenizer, tiny_model_factory):
    parent, child = grown_indices()
    grown = grow_adapter(
        trained(tokenizer, tiny_model_factory, parent, "llama", True, False), tokenizer, parent, child
    )
    with pytest.raises(ValueError, match="whole catalogue"):
        ground_new_items(grown, tokenizer, parent, child, _catalogue(child.item_ids[16:]), max_steps=1)
    with pytest.raises(ValueError, match="replay must be >= 0"):
        ground_new_items(grown, tokenizer, parent, child, _catalogue(child.item_ids), replay=-1, max_steps=1)


def test_runs_through_the_grounding_trainer_with_a_grounding_config(tokenizer, tiny_model_factory, tmp_path):
    """A GroundingConfig drives it: with output_dir the run leaves the grounding stage's manifest, loss log and
    adapter there, and a resume of the finished run takes no step."""
    from peft_grounded.new_items import IncrementalGroundingConfig
    from peft_grounded.training.stage_config import GroundingConfig

    parent, child = grown_indices()
    grown = grow_adapter(
        trained(tokenizer, tiny_model_factory, parent, "llama", True, False), tokenizer, parent, child
    )
    args = IncrementalGroundingConfig(output_dir=str(tmp_path / "run"), max_steps=3, replay=0.0)
    assert isinstance(args, GroundingConfig) and args.lr_scheduler_type == "constant"
    catalogue = _catalogue(child.item_ids[16:])
    result = ground_new_items(grown, tokenizer, parent, child, catalogue, args)
    assert len(result.losses) == 3
    assert {"run.json", "log_history.json", "adapter"} <= {p.name for p in (tmp_path / "run").iterdir()}
    after = {n: p.detach().clone() for n, p in grown.named_parameters()}
    resumed = IncrementalGroundingConfig(
        output_dir=str(tmp_path / "run"), max_steps=3, replay=0.0, resume_from_checkpoint="last"
    )
    ground_new_items(grown, tokenizer, parent, child, catalogue, resumed)
    assert all(torch.equal(p, after[n]) for n, p in grown.named_parameters())
    with pytest.raises(ValueError, match="weight_decay must be 0"):
        IncrementalGroundingConfig(weight_decay=0.01)


def test_grow_adapter_flags_build_the_config():
    """The command's flags are the config's fields; unset ones keep the config's defaults."""
    from peft_grounded.cli import growth

    given = [
        "--max_steps",
        "4",
        "--learning_rate",
        "0.01",
        "--per_device_train_batch_size",
        "2",
        "--replay",
        "0",
    ]
    args = ["--adapter", "a", "--parent_index", "p", "--sid_index", "s", "--output_dir", "o"]
    _, grounding = growth.GROW_ADAPTER.parse([*args, *given, "--rows", "new"])
    config = grounding.config
    assert (config.max_steps, config.learning_rate, config.per_device_train_batch_size) == (4, 0.01, 2)
    assert (config.replay, config.rows, config.seed, config.bf16) == (0.0, "new", 0, False)
    _, default = growth.GROW_ADAPTER.parse(args)
    assert (default.config.max_steps, default.config.per_device_train_batch_size) == (30, 8)


@pytest.mark.parametrize(("tied", "lora", "objective"), [(True, True, "sequence"), (False, False, "prompt")])
def test_tuning_on_the_log_trains_the_new_items_rows_alone(
    tokenizer, tiny_model_factory, tied, lora, objective
):
    """Logged (history, next item) pairs in the adapter's own format: the new items' rows move, the rest (the
    LoRA too) stays bit-identical, and the logged new items' loss falls."""
    from dataclasses import asdict

    from peft_grounded.new_items import tune_new_items_on_log
    from peft_grounded.prompts import PromptFormat
    from peft_grounded.sids.extended_base import record_sid_facts

    parent, child = grown_indices()
    model = trained(tokenizer, tiny_model_factory, parent, "llama", tied, lora)
    record_sid_facts(model, prompt_format=asdict(PromptFormat(objective=objective, max_history=3)))
    grown = grow_adapter(model, tokenizer, parent, child)
    catalogue = _catalogue(child.item_ids)
    pairs = [(("0", "1", "2", "3"), "new0"), (("4",), "new1"), (("5", "6"), "new2"), (("7", "8"), "9")]
    before = {n: p.detach().clone() for n, p in grown.named_parameters()}
    flags = {n: p.requires_grad for n, p in grown.named_parameters()}
    result = tune_new_items_on_log(
        grown, tokenizer, parent, child, catalogue, pairs, max_steps=8, learning_rate=5e-2, batch_size=4
    )
    expected = rows_used(child, child.item_ids[16:])
    assert result.trained_rows == expected and result.n_items == 3 and result.n_examples == 4
    assert len(result.losses) == 8 and result.losses[-1] < result.losses[0]
    mask = torch.zeros(child.n_tokens, dtype=torch.bool)
    mask[expected] = True
    for name, p in grown.named_parameters():
        if ".grounded_" in name:
            assert torch.equal(p[~mask], before[name][~mask]), name
            assert not torch.equal(p[mask], before[name][mask]), name
        else:
            assert torch.equal(p, before[name]), name  # backbone and LoRA unchanged
        assert p.requires_grad == flags[name]
    with pytest.raises(ValueError, match=r"no SID in the grown index .*add-items"):
        tune_new_items_on_log(grown, tokenizer, parent, child, catalogue, [(("0",), "nope")])
    with pytest.raises(ValueError, match="nothing to tune on"):
        tune_new_items_on_log(grown, tokenizer, parent, child, catalogue, [((), "new0")])
