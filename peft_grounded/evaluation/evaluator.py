"""One evaluation pass of a SID recommender: rankings and target likelihoods on the same sampled users.

:func:`evaluate` samples each part's users once (a seeded sample of all users and one of cold-target
users, see :mod:`.reports`), renders their prompts once, decodes them with the SID-constrained beam search
and scores their targets' log-likelihood (either can be switched off). It returns an :class:`Evaluation`:
the aggregate results in the shapes the runner, CLI and reports use, plus one record per sampled user
(``user``, ``target``, membership in the ``all`` / ``cold`` samples, the target's 0-based ``rank`` in the
beam-search list or ``None`` when absent, and the NLLs), which the paired intervals of :mod:`.reports`
are computed from.

:func:`target_log_likelihood` (below): the held-out item's log-likelihood under the trie, scored in the same
pass.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..decoding.beam import target_nlls
from ..decoding.heads import SIDSoftmax, StepHead
from ..decoding.search import left_pad
from ..decoding.trie import check_targets, item_token_ids
from .metrics import rank_metrics, target_rank
from .reports import EvalSettings, Results, _autocast, _part_prompts, user_records


@dataclass
class Evaluation:
    """Aggregates (``metrics``: ``{part: {"all", "cold", "decoding"}}``; ``likelihood``:
    ``{part: {"all", "cold"}}``) and per-user records (``users``: ``{part: [record, ...]}``)."""

    metrics: Results = field(default_factory=dict)
    likelihood: Results = field(default_factory=dict)
    users: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"metrics": self.metrics, "likelihood": self.likelihood, "users": self.users}


def evaluate(
    model: Any,
    tokenizer: Any,
    split: Any,
    index: Any,
    catalogue: Any = None,
    fmt: Any = None,
    parts: tuple[str, ...] = ("valid", "test"),
    settings: EvalSettings | None = None,
    trie: Any = None,
    *,
    ranking: bool = True,
    likelihood: bool = True,
    sid_softmax: SIDSoftmax = None,
    new_item_rule: Any = None,
    peer_fusion: Any = None,
    show_progress: bool = False,
) -> Evaluation:
    """Rank (the served lists) and/or score (target NLL) the split's sampled users in one pass (``show_progress``:
    a bar over each part's decoding batches).

    ``sid_softmax`` (:data:`~peft_grounded.decoding.heads.SIDSoftmax`): the rows each step normalises over;
    None reads it from the model's adapter, so a plain model (a merged one) needs it given, as serving does.
    ``new_item_rule``: the :class:`~peft_grounded.new_items.NewItemRule` stored with the adapter (what
    ``recommend`` serves the new items with; :func:`evaluate_adapter` loads it), None: the model alone.
    ``peer_fusion``: the :class:`~peft_grounded.serving.peer_fusion.PeerFusion` stored with the adapter
    (likewise)."""
    from ..decoding import SIDTrie
    from ..prompts import PromptFormat
    from ..serving.top_k import top_k_lists

    if not (ranking or likelihood):
        raise ValueError("nothing to evaluate: keep ranking=True, likelihood=True or both")
    if sid_softmax is None and not hasattr(model, "peft_config"):
        raise ValueError(
            "this model carries no adapter, so how it was trained to normalise each SID step is unknown and a "
            "guess scores other lists: pass sid_softmax=True (sft's default), False (the whole vocabulary) or "
            "the SID rows' token ids (GroundedRecommender.sid_rows), or evaluate the adapter before merging it"
        )
    settings = settings or EvalSettings()
    fmt = fmt or PromptFormat()
    if new_item_rule is not None:
        new_item_rule.check_index(index, "the given rule")
    if peer_fusion is not None:
        peer_fusion.check_index(index, "the given fusion")
    sids = item_token_ids(tokenizer, index)
    trie = trie or SIDTrie(sids)
    cold_items = split.cold_items(settings.cold_max_count)
    check_items_indexed(split, parts, index)
    result = Evaluation()
    for part in parts:
        (chosen, cold_chosen, cold_pool), (users, prompts, targets) = _part_prompts(
            split, part, settings, cold_items, index, tokenizer, catalogue, fmt
        )
        records = user_records(chosen, cold_chosen)
        if [r["user"] for r in records] != users:
            raise RuntimeError("prompts and user records are out of order; this is a bug, please report it")
        target_ids = [sids[t] for t in targets]
        together = ranking and likelihood and new_item_rule is None and peer_fusion is None  # one encoding
        with _autocast(model, settings):
            if ranking:
                histories = _full_histories(split, part)
                recs = top_k_lists(
                    model,
                    tokenizer,
                    index,
                    [histories[r["user"]] for r in records],
                    max(settings.ks),
                    fmt=fmt,
                    catalogue=catalogue,
                    new_item_rule=new_item_rule,
                    peer_fusion=peer_fusion,
                    num_beams=settings.num_beams,
                    exclude_history=settings.exclude_history,
                    trie=trie,
                    sid_softmax=sid_softmax,
                    batch_size=settings.decode_batch_size,
                    targets=target_ids if together else None,
                    show_progress=show_progress,
                )
                for record, items, scores in zip(records, recs.items, recs.scores, strict=True):
                    record["rank"] = target_rank(items, record["target"])
                    record["items"] = list(items)
                    record["scores"] = [round(float(s), 6) for s in scores]
            if likelihood:
                scores = (
                    recs.extra["target_nlls"]
                    if together
                    else target_log_likelihood(
                        model, tokenizer, prompts, target_ids, trie, settings.decode_batch_size, sid_softmax
                    )
                )
                for record, score in zip(records, scores, strict=True):
                    record.update(score)
        result.users[part] = records
        subsets = ("all", "cold") if settings.cold else ("all",)
        if ranking:
            result.metrics[part] = {
                subset: rank_metrics([r["rank"] for r in records if r[subset]], settings.ks)
                for subset in subsets
            } | {"decoding": recs.stats() | {"served": served_lists(new_item_rule, peer_fusion)}}
        if likelihood:
            result.likelihood[part] = {
                subset: _means([r for r in records if r[subset]]) for subset in subsets
            }
        for target in (result.metrics, result.likelihood) if settings.cold else ():
            if part in target:
                target[part]["cold"]["cold_users_available"] = len(cold_pool)
    return result


def _full_histories(split: Any, part: str) -> dict[str, list[str]]:
    """Each user's items before the ``part``'s target, oldest first (the whole history, not the prompt's
    tail): what the route leaves out of the list and the new-item rule reads."""
    return {u.user_id: list(u.history) if part == "valid" else [*u.history, u.valid] for u in split.users}


def check_items_indexed(split: Any, parts: tuple[str, ...], index: Any) -> None:
    """Refuse, before any decoding, users whose target or history items have no SID in ``index``."""
    from ..prompts import HistoryError

    missing: dict[str, None] = {}
    for part in parts:
        for _, history, target in getattr(split, f"{part}_examples")(None):
            for item in (*history, target):
                if item not in index:
                    missing[item] = None
    if missing:
        names = list(missing)
        raise HistoryError(
            f"{len(names)} items of the {'/'.join(parts)} users (targets or histories) have no SID in the index "
            f"(e.g. {names[:5]}): evaluate on the catalogue the index was built from, or add the items to the "
            "index (peft-grounded add-items) and grow the adapter (peft-grounded grow-adapter)"
        )


def _means(records: list[dict[str, Any]]) -> dict[str, float | int | None]:
    means: dict[str, float | int | None] = {
        name: (math.fsum(r[name] for r in records) / len(records) if records else None)
        for name in LIKELIHOOD_METRICS
    }
    return means | {"users": len(records)}


def evaluate_adapter(
    adapter: str,
    index: Any,
    catalogue: Any,
    settings: EvalSettings | None = None,
    *,
    model_path: str | None = None,
    fmt: Any = None,
    parts: tuple[str, ...] = ("valid", "test"),
    likelihood: bool = True,
    peer_fusion: bool = True,
    show_progress: bool = False,
) -> Evaluation:
    """Load a trained adapter onto its base (checked against ``index``) and :func:`evaluate` it as
    ``recommend`` serves it: with the prompt format recorded in the adapter (unless ``fmt`` is given) and the
    new-item rule or peer fusion stored beside it (``new_item_rule.json``, ``peer_fusion.json``, checked
    against ``index``), when there is one; ``peer_fusion=False``: the model without its fusion."""
    from ..new_items.rule import NewItemRule
    from ..serving.peer_fusion import PeerFusion, stored_fix
    from ..sids.catalogue_source import index_catalogue
    from ..sids.extended_base import base_model_path, prompt_format_of, sid_model

    catalogue = index_catalogue(index, catalogue, flag="catalogue=")  # None: the index's own
    settings = settings or EvalSettings()
    dtype = torch.bfloat16 if settings.bf16 else torch.float32
    rule = NewItemRule.load(adapter)
    if rule is not None:
        rule.check_index(index, f"the folder {str(adapter)!r}")
    fusion = PeerFusion.load(adapter) if peer_fusion else None
    if fusion is not None:
        fusion.check_index(index, f"the folder {str(adapter)!r}", stored_fix(adapter))
    tokenizer, model = sid_model(
        model_path or base_model_path(adapter), index, adapter=adapter, is_trainable=False, dtype=dtype
    )
    return evaluate(
        model,
        tokenizer,
        catalogue.leave_one_out(),
        index,
        catalogue,
        fmt or prompt_format_of(model),
        parts,
        settings,
        likelihood=likelihood,
        new_item_rule=rule,
        peer_fusion=fusion,
        show_progress=show_progress,
    )


def peer_fingerprint(peer: Any) -> str:
    """Short sha256 of a SASRec peer: its items and weights (the same peer gives the same string)."""
    import hashlib

    digest = hashlib.sha256("\n".join(map(str, peer.item_ids)).encode())
    for name, tensor in sorted(peer.model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().to(torch.float32).cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def served_lists(new_item_rule: Any = None, peer_fusion: Any = None) -> dict[str, Any]:
    """What the lists scored were (``metrics[part]["decoding"]["served"]``): the model's beams fused with a
    peer (its weight, depth and fingerprint), mixed by a new-item rule, or the model alone."""
    if peer_fusion is not None:
        return {
            "lists": "fused",
            "weight": peer_fusion.weight,
            "depth": peer_fusion.depth,
            "peer": peer_fingerprint(peer_fusion.peer),
            "weight_chosen_on_users": peer_fusion.fitted_on.get("users"),
        }
    if new_item_rule is not None:
        return {
            "lists": "new-item rule",
            "mode": new_item_rule.mode,
            "beams": new_item_rule.beams,
            "model_weight": new_item_rule.model_weight,
            "new_items": len(new_item_rule.new_items),
        }
    return {"lists": "model alone"}


def describe_served(served: dict[str, Any]) -> str:
    """One line of :func:`served_lists`' record."""
    if served["lists"] == "fused":
        return (
            f"served: the model's beams fused with a SASRec peer (peer {served['peer']}), "
            f"log p_model + {served['weight']:g} log p_SASRec over the top {served['depth']}"
        )
    if served["lists"] == "new-item rule":
        return (
            f"served: the new-item rule ({served['mode']} mode, {served['new_items']} new items, "
            f"{served['beams']} beams, model weight {served['model_weight']:g})"
        )
    return "served: the model's lists alone"


EVALUATION_FILES = ("metrics.json", "metrics.md", "likelihood.json", "users.json")  # metrics.json first


def _is_evaluation_metrics(value: Any) -> bool:
    """Whether a ``metrics.json`` holds :func:`evaluate_adapter_into`'s results (``{part: {...}}``)."""
    return isinstance(value, dict) and bool(value) and set(value) <= {"valid", "test"}


def check_evaluation_output(output: str | Path) -> None:
    """Raise ``ValueError`` unless ``output`` may receive the evaluation files (see
    :func:`peft_grounded._io.check_report_folder`): a training run's folder, or files of that name
    another tool wrote, are refused before anything is loaded."""
    from .._io import check_report_folder

    check_report_folder(Path(output), "`peft-grounded evaluate`", EVALUATION_FILES, _is_evaluation_metrics)


def write_evaluation(output: str | Path, evaluation: Evaluation, title: str) -> Path:
    """Write ``metrics.json``, ``likelihood.json``, ``users.json`` and ``metrics.md`` into ``output``."""
    from .reports import markdown_table, write_json, write_text_atomic

    out = Path(output)
    write_json(out / "metrics.json", evaluation.metrics)
    write_json(out / "likelihood.json", evaluation.likelihood)
    write_json(out / "users.json", evaluation.users)
    table = markdown_table(evaluation.metrics, title=title)
    served = [
        p["decoding"]["served"] for p in evaluation.metrics.values() if "served" in p.get("decoding", {})
    ]
    write_text_atomic(out / "metrics.md", table + (f"\n{describe_served(served[0])}\n" if served else ""))
    return out


def evaluate_adapter_into(
    output: str | Path,
    adapter: str,
    index: Any,
    catalogue: Any,
    settings: EvalSettings | None = None,
    **kwargs: Any,
) -> Evaluation:
    """:func:`evaluate_adapter` (``kwargs`` go there) with its files written into ``output`` (the
    ``evaluate`` command): the folder is locked and checked first, so a refusal costs no decoding."""
    from .._io import output_lock

    with output_lock(output, "evaluate"):
        check_evaluation_output(output)
        evaluation = evaluate_adapter(adapter, index, catalogue, settings, **kwargs)
        write_evaluation(output, evaluation, title=f"Evaluation of {adapter}")
    return evaluation


# How likely a model finds each user's held-out item: a continuous companion to Recall/NDCG.
#
# Recall@K on a few hundred users is a count of rare hits: at small training budgets it is zero or one
# hit for every strategy and cannot tell them apart. The log-likelihood of the target's SID moves with
# every step of training. Per user it is measured two ways:
#
# * ``nll``: ``-log p(SID | prompt)`` under the full vocabulary (format and item together), or under the
#   SID rows only for a model trained with the SID-only softmax (``sid_softmax``, recorded in its adapter);
# * ``constrained_nll``: the same with each step's distribution renormalised over the tokens the SID trie
#   allows, i.e. ``-log p(item)`` under the distribution the constrained beam search ranks by; its
#   reference ``uniform_nll`` is the value of a model that spreads its mass evenly over the trie.
#
# Per-user values and their means over a part's sampled users come from :func:`~.evaluator.evaluate`.

LIKELIHOOD_METRICS = ("nll", "constrained_nll", "uniform_nll")


@torch.no_grad()
def target_log_likelihood(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    targets: Sequence[Sequence[int]],
    trie: Any,
    batch_size: int = 16,
    sid_softmax: SIDSoftmax = None,
) -> list[dict[str, float]]:
    """Per prompt, ``{"nll", "constrained_nll", "uniform_nll"}`` of its target token ids (in nats).

    Each prompt must end exactly where the SID starts (as :func:`~peft_grounded.prompts.inference_prompts`
    builds them), and each target must be a complete SID of ``trie``. ``sid_softmax``: ``nll`` normalised
    over the SID rows only (None: as the model's adapter was trained, see
    :class:`~peft_grounded.decoding.heads.StepHead`).
    """
    check_targets(targets, trie, len(prompts))
    head = StepHead.for_model(model, sid_softmax)
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id or 0
    was_training = model.training
    model.eval()
    out: list[dict[str, float]] = []
    try:
        for start in range(0, len(prompts), batch_size):
            chunk = range(start, min(start + batch_size, len(prompts)))
            seqs = [
                tokenizer(prompts[i], add_special_tokens=False)["input_ids"] + list(targets[i]) for i in chunk
            ]
            keep = max(len(targets[i]) for i in chunk) + 1
            input_ids, mask = left_pad(seqs, pad)  # every target ends in the last column
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            logits, _ = head(
                model,
                keep,
                input_ids=input_ids.to(device),
                attention_mask=mask.to(device),
                position_ids=positions.to(device),
            )
            chunk_targets = [list(map(int, targets[i])) for i in chunk]
            out.extend(target_nlls(logits, chunk_targets, keep, trie, head.sid_ids))
    finally:
        model.train(was_training)
    return out
