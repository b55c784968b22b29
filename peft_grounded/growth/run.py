"""The ``grow-adapter`` command as a function: grow a saved adapter onto an ``add-items`` index, optionally
ground the new items, and save it into a folder, replacing only what the command owns there."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._locks import locks_output
from .._owned import PEFT_CARD_MARKER, is_generated_card, replace_keeping_others
from ..new_items.rule import RULE_FILES

if TYPE_CHECKING:
    from .grounding import IncrementalGroundingConfig

ADAPTER_CONFIG = "adapter_config.json"  # what PEFT's save_pretrained writes first
ADAPTER_FILES = (  # an adapter's own files (its new-item rule included: fitted for this adapter's index)
    ADAPTER_CONFIG,
    "adapter_model.safetensors",
    "adapter_model.bin",
    *RULE_FILES,
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
    weights and PEFT's model card; anything else (a README of the user's, notes, data) is kept."""
    from ..sids.model import SID_RECORD

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
        from ..sids.model import save_sid_record

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


@locks_output("output", "grow-adapter")
def grow_adapter_into(
    adapter: str | Path,
    parent_index: str | Path,
    sid_index: str | Path,
    output: str | Path,
    *,
    model: str | None = None,
    init: str = "centroid",
    weights_dtype: str = "float32",
    overwrite: bool = False,
    ground: str | None = None,
    grounding: IncrementalGroundingConfig | None = None,
    interactions: str | Path | None = None,
) -> dict[str, Any]:
    """Grow the adapter saved in ``adapter`` (trained on ``parent_index``) onto ``sid_index``, ground the new
    items on the catalogue ``ground`` when given (settings: ``grounding``, default an
    :class:`~peft_grounded.growth.grounding.IncrementalGroundingConfig`, checked when it is made), and save it
    to ``output``; returns a summary.

    ``output`` is locked and checked before anything is loaded; with ``overwrite`` an adapter there is
    replaced, its other files kept. ``interactions``: a JSONL file of histories logged since the adapter was
    trained (``{"user": ..., "history": [...]}``, newest item last): the new-item rule
    (:class:`~peft_grounded.new_items.NewItemRule`) is fitted on it and saved with the grown adapter."""
    import torch

    from ..sids import SIDIndex, load_catalogue
    from ..sids.model import base_model_path, sid_model
    from .adapter import check_lineage, grow_adapter
    from .grounding import IncrementalGroundingConfig, ground_new_items, new_item_ids

    output, adapter = Path(output), Path(adapter)
    check_output(output, adapter, overwrite)
    if ground is not None and grounding is None:
        grounding = IncrementalGroundingConfig()
    parent, child = SIDIndex.load(parent_index), SIDIndex.load(sid_index)
    check_lineage(parent, child)  # the refusal grow_adapter gives, before the model is loaded
    rule = None
    if interactions is not None:  # fitted before the model loads: a bad file fails fast
        from ..new_items.rule import NewItemRule
        from ..serving import read_histories

        logged = read_histories(interactions)[1]
        rule = NewItemRule.fit(child, logged, new_items=new_item_ids(parent, child))
    catalogue = None
    if ground is not None:
        catalogue = load_catalogue(ground)
        new_ids = new_item_ids(parent, child)
        missing = [i for i in new_ids if i not in catalogue.items]
        if new_ids and len(missing) == len(new_ids):
            raise ValueError(
                f"--ground {ground} holds none of the {len(new_ids)} new items (e.g. {missing[0]!r}); "
                "pass the catalogue with their text (the one given to add-items, plus the old items for "
                "--replay)"
            )
        if missing:
            print(
                f"warning: {len(missing)} new items have no text in --ground; they are not grounded",
                file=sys.stderr,
            )

    tokenizer, peft_model = sid_model(
        model or base_model_path(str(adapter)),
        parent,
        adapter=str(adapter),
        dtype=getattr(torch, weights_dtype),
    )
    grown = grow_adapter(peft_model, tokenizer, parent, child, init=init)
    summary: dict[str, Any] = {
        "new_tokens": child.n_tokens - parent.n_tokens,
        "new_items": child.n_items - parent.n_items,
        "rows": child.n_tokens,
        "init": init,
        "fingerprint": child.fingerprint(),
    }
    if catalogue is not None:
        result = ground_new_items(grown, tokenizer, parent, child, catalogue, grounding)
        summary["grounding"] = {
            "seconds": round(result.seconds, 3),
            "steps": len(result.losses),
            "examples": result.n_examples,
            "replayed": result.n_replayed,
            "trained_rows": len(result.trained_rows),
            "loss": [round(result.losses[0], 4), round(result.losses[-1], 4)] if result.losses else None,
        }
    if rule is not None:  # whose beams the rule mixes: the grown model's, or text KNN where that wins
        from ..serving import GroundedRecommender
        from ..sids.model import prompt_format_of

        GroundedRecommender(grown, tokenizer, child, prompt_format_of(grown)).choose_new_item_beams(
            rule, logged
        )
    check_output(output, adapter, overwrite)  # again: the folder may have changed while this ran
    kept = save_adapter_keeping_others(grown, output)
    if rule is not None:
        rule.save(output)
        summary["new_item_rule"] = {"mode": rule.mode, **rule.fitted_on}
    if kept:
        summary["kept"] = kept
    return summary
