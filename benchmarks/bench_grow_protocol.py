"""New items without retraining, measured: the evaluation protocol of issue 12.

    OMP_NUM_THREADS=1 python benchmarks/bench_grow_protocol.py --out runs/grow-ml100k          # ~30 min
    OMP_NUM_THREADS=1 python benchmarks/bench_grow_protocol.py --out runs/grow-smoke --smoke   # ~1-2 min

Defaults (one CPU thread, SmolLM2-135M): the ``cpu`` recipe's ``sequence`` objective (SID-only chunks of 20
items, every item a target; ``max_length`` 128), LoRA r 8 / alpha 16 on all linear layers + the new rows and
batch 8, and SIDs (3 x 64); the full head, a learning rate of 1e-3 (the grounding stage's default) for both
stages, a bfloat16 base under bf16 autocast, and a *time* budget: ``--minutes`` of SFT (and
``--grounding-minutes`` of grounding for a grounding strategy) for each of the two trained models, so the
old-catalogue model and the full-catalogue reference get the same wall-clock. The plan (what runs, for
how long) is printed first. A setting the package declares is parsed from its dataclass under its flag
(``--learning_rate``, ``--per_device_train_batch_size``, ``--lora_r``, ``--levels``, ``--objective``, ...; also
with dashes), the protocol's defaults of those in :data:`DEFAULTS`.

1. Hold out the catalogue's newest ``--share`` of items (by first interaction: RecBole timestamps when
   the catalogue has them, else the earliest relative position in a user's sequence).
2. Build SIDs on the rest (MiniLM, 3 x 64 + disambiguation; ``--item-vectors behaviour`` or ``mix``: from
   the SASRec item embeddings of the old items' training interactions, as ``build-sids --recipe cpu``) and
   train the ``--strategy`` (init -> [grounding] -> LoRA SFT) on the interactions with those items only.
3. Add the held-out items (``new_items.add_items``; on a behaviour index their text goes through the index's
   text-to-behaviour map, since no interaction of theirs is known), grow the trained adapter
   (``grow_adapter``, centroid rows for the new tokens). The served rule's text expert and text KNN read the
   items' text vectors whatever the SIDs were built from.
4. Score ALL test users whose (leave-one-out, full catalogue) target is a new item (``--positions
   last-two``: or whose validation target is, one example per user; ``--users N`` caps them to a seeded
   sample, for smoke runs only), with the same ``PromptFormat`` as training:
   Recall/NDCG@K with a 95% bootstrap interval of the mean for: the grown model; the grown model after
   incremental grounding (``ground_new_items``); a model retrained from scratch on the full catalogue at
   the same budget (the upper reference); popularity over the training targets (which cannot rank a new
   item). Paired bootstrap intervals (the same resampled users for both rows) of the differences grown -
   retrained and grown+incremental - grown. Also the share of the top-K slots that go to new items.
5. The served rule (the semantic mixture in ``share`` mode, what ``peft-grounded recommend`` and ``evaluate``
   serve: its rows go through the package's one route, ``peft_grounded.serving.top_k_lists``) against
   two controls, paired, on both user groups: the *text-only mixture* (the same mixture with a softmax of
   text KNN over all items in place of the LLM's beams) and the new items ranked by ``p_text`` alone (no
   model). Where the served rule does not beat them, the LLM's beams add nothing for new-item users. Then
   all users as the population holds them (the two groups weighted by their shares of the users, a
   stratified bootstrap): what a shop serving one rule to everyone gets. The controls, the slot rule and
   that interval live beside this script (``benchmarks/new_item_protocol.py``); the model-alone rows go
   through the same route.

Writes ``<out>/protocol.json`` (with per-user ranks of the target) and ``<out>/protocol.md``; training
runs resume (``<out>/old``, ``<out>/full``).
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from peft_grounded import assets
from peft_grounded.cli.common import DataArguments, SFTArguments
from peft_grounded.cli.model_config import LoraModelConfig
from peft_grounded.cli.recommend import RecommendArguments
from peft_grounded.cli.sids import BuildSIDsArguments
from peft_grounded.decoding import Recommendations
from peft_grounded.decoding.search import model_beams
from peft_grounded.evaluation import EvalSettings
from peft_grounded.evaluation.metrics import metric_value, ranking_metrics, target_rank
from peft_grounded.evaluation.peers import TextKNN
from peft_grounded.intervals import bootstrap_interval
from peft_grounded.new_items import (
    NewItemRule,
    SemanticMixture,
    add_items,
    ground_new_items,
    grow_adapter,
    held_out_log,
    new_item_beams,
    tune_new_items_on_log,
)
from peft_grounded.pipeline import Budget, Experiment, run_strategy, strategy
from peft_grounded.prompts import PromptFormat
from peft_grounded.recipes import CPU, CPU_SIDS
from peft_grounded.serving.top_k import top_k_lists
from peft_grounded.sids import SIDIndex, build_sids, load_catalogue
from peft_grounded.sids.behaviour import ItemVectorsConfig
from peft_grounded.sids.catalogue import TextTemplate
from peft_grounded.sids.encoders import encode_texts, load_encoder
from peft_grounded.sids.extended_base import RowStart, sid_model
from peft_grounded.training.stage_config import GroundingConfig, RecommendationConfig

try:
    from benchmarks._args import Precision, ZeroOrMore, field_default, package_fields, parse
    from benchmarks.new_item_protocol import (
        P_TEXT,
        TEXT_ONLY,
        blended,
        control_lists,
        default_match_levels,
        first_seen,
        full_histories,
        logged_pairs,
        mix_new_items,
        new_item_examples,
        random_slots,
    )
except ModuleNotFoundError:  # run as a file: its folder is on sys.path, not the repository
    from _args import Precision, ZeroOrMore, field_default, package_fields, parse
    from new_item_protocol import (
        P_TEXT,
        TEXT_ONLY,
        blended,
        control_lists,
        default_match_levels,
        first_seen,
        full_histories,
        logged_pairs,
        mix_new_items,
        new_item_examples,
        random_slots,
    )


def interval(values: np.ndarray, seed: int, rounds: int) -> tuple[float, float]:
    """95% percentile bootstrap interval of the mean over users (the package's resampling)."""
    if not len(values):
        return float("nan"), float("nan")
    found = bootstrap_interval([values], resamples=rounds, seed=seed)
    return found["low"], found["high"]


def per_user(predictions: list[list[str]], targets: list[str], k: int) -> dict[str, np.ndarray]:
    """Per-user hit (Recall@k) and NDCG@k, and the target's rank (0 = not in the top k)."""
    ranks = [target_rank(p[:k], t) for p, t in zip(predictions, targets, strict=True)]
    return {
        f"recall@{k}": np.array([metric_value(r, f"recall@{k}") for r in ranks]),
        f"ndcg@{k}": np.array([metric_value(r, f"ndcg@{k}") for r in ranks]),
        "rank": np.array([0 if r is None else r + 1 for r in ranks]),  # 1-based; 0: not in the top k
    }


def score(predictions: list[list[str]], targets: list[str], new: set[str], k: int) -> dict:
    values = per_user(predictions, targets, k)
    metrics = ranking_metrics([p[:k] for p in predictions], targets, (k,))
    slots = [i for p in predictions for i in p[:k]]
    return {
        f"recall@{k}": metrics[f"recall@{k}"],
        f"ndcg@{k}": metrics[f"ndcg@{k}"],
        "new_item_slot_share": sum(i in new for i in slots) / max(len(slots), 1),
        "users": len(targets),
        "per_user": values,
    }


@contextmanager
def decoding(model, bf16: bool):
    """No gradients, and bf16 autocast when the protocol runs in bf16."""
    device = model.device.type if hasattr(model, "device") else "cpu"
    with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16) if bf16 else nullcontext():
        yield


def decode(model, tokenizer, histories, index, catalogue, fmt, beams: int, bf16: bool) -> Recommendations:
    """All ``beams`` beams per history, best first, prompts in the training ``fmt``: the first search of the
    package's route (:func:`peft_grounded.decoding.search.model_beams`), cached to re-score serving rules."""
    with decoding(model, bf16):
        return model_beams(
            model, tokenizer, index, histories, beams, fmt=fmt, catalogue=catalogue, batch_size=8
        )


def served(model, tokenizer, histories, index, catalogue, fmt, beams, k: int, bf16: bool, rule=None) -> list:
    """The lists ``peft-grounded recommend`` and ``evaluate`` serve (:func:`peft_grounded.serving.top_k_lists`,
    with ``rule`` or the model alone, the history kept as the protocol's rows always did), the cached
    ``beams`` as their first search."""
    with decoding(model, bf16):
        return top_k_lists(
            model,
            tokenizer,
            index,
            histories,
            k,
            fmt=fmt,
            catalogue=catalogue,
            new_item_rule=rule,
            num_beams=beams.num_beams,
            exclude_history=False,
            batch_size=8,
            beams=beams,
        ).items


def cached_decode(
    path: Path, adapter: Path | None, decode_fn, examples: list[tuple], beams: int
) -> Recommendations:
    """``decode_fn()``, or the beams a previous run of the same adapter, users and width wrote to ``path``
    (so that serving rules can be re-scored without decoding again); ``adapter=None``: never cached."""
    import hashlib

    if adapter is None:
        return decode_fn()
    digest = hashlib.sha256((adapter / "adapter_model.safetensors").read_bytes()).hexdigest()
    key = {"adapter": digest, "users": [e[0] for e in examples], "beams": beams}
    if path.is_file():
        saved = json.loads(path.read_text())
        if saved.get("key") == key:
            return Recommendations(items=saved["items"], scores=saved["scores"], k=beams, num_beams=beams)
    recs = decode_fn()
    path.write_text(json.dumps({"key": key, "items": recs.items, "scores": recs.scores}))
    return recs


SERVED = (
    "grown + semantic mixture (share)"  # the rule `recommend` serves (peft_grounded.new_items.NewItemRule)
)
CHOSEN = "grown + served, beams chosen on the log"  # NewItemRule.choose_beams: the model's, or text KNN


SMOKE = dict(  # a path check, not a measurement: seconds of training, a few users
    minutes=0.2,
    grounding_minutes=0.1,
    max_examples=64,
    users=4,
    old_users=4,
    choice_users=8,
    incremental_steps=2,
    run_eval_users=1,
)


@dataclass(kw_only=True)
class Settings(Precision):
    """The catalogue split, the trained models' budget, the served rules and the scoring (``--fp32`` /
    ``--no-bf16``, ``--bf16``: the base's precision and autocast; neither: the machine's choice)."""

    out: str = field(metadata={"help": "protocol.json / protocol.md and the training runs (resumed)"})
    dataset: str = field(default="movielens-100k", metadata={"help": "the catalogue (a name or a folder)"})
    smoke: bool = field(default=False, metadata={"help": f"tiny budget path check: {SMOKE}"})
    share: float = field(default=0.1, metadata={"help": "newest share of items held out"})
    positions: Literal["test", "last-two"] = field(
        default="test",
        metadata={
            "help": "new-item targets scored: each user's test target, or (last-two) the test target when it is "
            "a new item, else the validation target when it is one (one per user; no model trains on either)"
        },
    )
    strategy: str = field(default="centroid", metadata={"help": "centroid | centroid_gti | gti | mean ..."})
    minutes: float = field(default=12.0, metadata={"help": "SFT minutes per trained model"})
    grounding_minutes: float = field(
        default=2.0,
        metadata={
            "help": "grounding minutes per trained model (only strategies that ground: gti, centroid_gti)"
        },
    )
    sft_steps: int = field(default=0, metadata={"help": "step cap on SFT (0: the time alone)"})
    grounding_steps: int = field(default=0, metadata={"help": "step cap on grounding (0: time)"})
    choice_users: int = field(
        default=500,
        metadata={
            "help": "logged (history, next item) pairs, a seeded sample of the calibration positions, on which "
            "the served rule chooses whose beams it mixes (NewItemRule.choose_beams; 0: no choice row)"
        },
    )
    incremental_steps: int = field(default=30, metadata={"help": "incremental grounding steps per variant"})
    incremental_lr: float | None = field(
        default=None, metadata={"help": "incremental grounding's learning rate (None: --learning_rate)"}
    )
    replay: list[float] = field(
        default_factory=lambda: [0.0, 1.0],
        metadata={
            "help": "incremental grounding variants: old items' pairs mixed in per new item (0: new items alone; "
            "none given: no incremental grounding)",
            "action": ZeroOrMore,
        },
    )
    log_steps: int = field(
        default=0,
        metadata={
            "help": "an arm whose new items' rows are tuned on the logged (history, next item) pairs for this "
            "many steps (new_items.tune_new_items_on_log), all but a held-out sample (new_items.held_out_log) "
            "on which the served rule's model weight is fitted; scored alone, served, and served with new items "
            "by p_text x p_model^weight; 0: no such arm"
        },
    )
    log_lr: float | None = field(
        default=None, metadata={"help": "the log tuning's learning rate (None: --learning_rate)"}
    )
    new_item_share: list[float] = field(
        default_factory=lambda: [0.1, 0.2],
        metadata={
            "help": "the grown model with new-item slots (TIGER's cold-start rule, new_item_protocol.mix_new_items): at "
            "most this share of the top-k goes to new items sharing a generated item's SID prefix",
            "action": ZeroOrMore,
        },
    )
    match_levels: list[int] | None = field(
        default=None,
        metadata={
            "help": "prefix codes a new item must share with a generated item, one variant each (None: all "
            "levels but the last, and one fewer)"
        },
    )
    no_retrained: bool = field(
        default=False,
        metadata={"help": "skip the full-catalogue reference model (its training and decoding)"},
    )
    old_users: int = field(
        default=200,
        metadata={
            "help": "a seeded sample of test users whose target is an old item, scored too (what growth costs "
            "them)"
        },
    )
    users: int = field(
        default=0, metadata={"help": "cap on new-item-target test users scored (0: all of them)"}
    )
    run_eval_users: int = field(
        default=8,
        metadata={
            "help": "users the strategy runner itself decodes for its valid/test metrics (not the protocol's)"
        },
    )
    rounds: int = field(default=2000, metadata={"help": "bootstrap resamples"})
    # the package's settings, parsed beside these (parse_args) under the package's flags, set here by settle:
    # the prompt format (--objective, --max_history), the base and its LoRA (--layers, --lora_r, --lora_alpha),
    # the SIDs (--levels, --codes), both stages' training (--learning_rate, --per_device_train_batch_size,
    # --max_length, --seed: the run's, and the samples'; --sid_softmax: SFT's), the examples (--max_examples), how
    # the rows start beyond the strategy's init (--init_scale, --centroid_variant) and what the SIDs and the
    # centroid start are built from (--item_vectors text|behaviour|mix: the old items' training interactions; new
    # items through the text map)
    prompt: PromptFields = field(init=False, default_factory=lambda: PromptFields())
    model: ModelFields = field(init=False, default_factory=lambda: ModelFields())
    sids: SIDFields = field(init=False, default_factory=lambda: SIDFields())
    training: TrainingFields = field(init=False, default_factory=lambda: TrainingFields())
    data: DataFields = field(init=False, default_factory=lambda: DataFields())
    start: RowStart = field(init=False, default_factory=RowStart)
    vectors: ItemVectorsConfig = field(init=False, default_factory=ItemVectorsConfig)

    def parts(self) -> tuple:
        """The package's settings parsed beside the protocol's own, in :data:`PARTS`' order."""
        return tuple(getattr(self, name) for name in PARTS)


# the fields of the package's settings dataclasses the protocol sets, as the package declares them
PromptFields = package_fields(SFTArguments, "objective", "max_history")
ModelFields = package_fields(LoraModelConfig, "layers", "lora_r", "lora_alpha")
SIDFields = package_fields(BuildSIDsArguments, "levels", "codes")
TrainingFields = package_fields(
    RecommendationConfig, "learning_rate", "per_device_train_batch_size", "max_length", "sid_softmax", "seed"
)
DataFields = package_fields(DataArguments, "max_examples")
# the lists as recommend serves them: their length k (the cut-off of Recall@K and NDCG@K) and the beams per user
ServingFields = package_fields(RecommendArguments, "k", "num_beams")
PARTS = {  # Settings' attributes holding them, in the order they are parsed beside Settings
    "prompt": PromptFields,
    "model": ModelFields,
    "sids": SIDFields,
    "training": TrainingFields,
    "data": DataFields,
    "serving": ServingFields,
    "start": RowStart,
    "vectors": ItemVectorsConfig,
}
DEFAULTS = {  # the protocol's defaults of the package's fields (the flags given win)
    # the cpu recipe's (peft_grounded.recipes): the objective, the LoRA, the batch, the SIDs
    "objective": CPU["objective"],
    "lora_r": CPU["lora_r"],
    "lora_alpha": CPU["lora_alpha"],
    "per_device_train_batch_size": CPU["per_device_train_batch_size"],
    "levels": CPU_SIDS["levels"],
    "codes": CPU_SIDS["codes"],
    # the protocol's own: both stages at the grounding stage's rate, the full head unless asked, and a row cap
    # that follows the objective (None: the cpu recipe's with its objective, RecommendationConfig's with the other)
    "learning_rate": field_default(GroundingConfig, "learning_rate"),
    "sid_softmax": False,
    "max_length": None,
}


def settle(args: Settings, *parts) -> Budget:
    """Defaults that follow other arguments, the checks, and the budget: all before any work; ``parts``, the
    package's settings parsed beside ``args`` (in :data:`PARTS`' order), are set on it."""
    for name, part in zip(PARTS, parts, strict=True):
        setattr(args, name, part)
    if args.start.init != RowStart().init:
        raise SystemExit(
            f"--init {args.start.init}: the strategy starts the rows (--strategy {args.strategy})"
        )
    if args.smoke:
        for key, value in SMOKE.items():
            setattr(next(p for p in (args, *args.parts()) if hasattr(p, key)), key, value)
    if args.serving.num_beams < args.serving.k:
        raise SystemExit(
            f"--num-beams {args.serving.num_beams} is below --k {args.serving.k}: beam search returns num_beams items"
        )
    if any(not 0 <= s <= 1 for s in args.new_item_share):
        raise SystemExit(f"--new-item-share takes fractions of k between 0 and 1, got {args.new_item_share}")
    args.prompt.max_history = prompt_format(args).max_history  # None: the package's for the objective
    if args.training.max_length is None:
        recipe = args.prompt.objective == CPU["objective"]
        args.training.max_length = (
            CPU["max_length"] if recipe else field_default(RecommendationConfig, "max_length")
        )
    args.fp32 = not args.choice().bf16
    return protocol_budget(args)


def parse_args(argv=None) -> Settings:
    """The settings, with the package's settings parsed beside them and set on it (``args.prompt``,
    ``args.model``, ``args.sids``, ``args.training``, ``args.data``, ``args.start``, ``args.vectors``)."""
    args, *_ = parse(
        (Settings, *PARTS.values()),
        argv,
        prog="bench_grow_protocol.py",
        description=__doc__,
        check=settle,
        defaults=DEFAULTS,
    )
    return args


def prompt_format(args: Settings) -> PromptFormat:
    """The prompt format of training and scoring (``SFTArguments.prompt_format``: None history, the objective's)."""
    return SFTArguments(objective=args.prompt.objective, max_history=args.prompt.max_history).prompt_format()


def model_config(args: Settings) -> LoraModelConfig:
    """The base and its stacked LoRA, as ``sft`` reads them (checked: ``--layers`` at least 0)."""
    return LoraModelConfig(**asdict(args.model))


def record(args: Settings) -> dict:
    """The settings as ``protocol.json`` records them (``budget``): the protocol's own and the package's parsed
    beside them, one flat mapping of flag names (``pool_grow_protocol`` reads its ``seed``, ``compare_grow_protocol``
    its ``out``)."""
    own = {f.name: getattr(args, f.name) for f in fields(args) if f.init}
    for part in args.parts():
        own |= asdict(part)
    return own


def protocol_budget(args: Settings) -> Budget:
    """The training budget the arguments describe, built (and so checked) before any work: a strategy that
    does not ground gets no grounding stage, whatever --grounding-steps and --grounding-minutes say."""
    grounds = strategy(args.strategy).ground
    bf16 = not args.fp32
    training = asdict(args.training)
    sid_softmax = training.pop("sid_softmax")  # SFT's alone
    training |= dict(bf16=bf16, save_steps=200, disable_tqdm=True)
    budget = Budget.from_training(
        training,
        # a strategy that does not ground has no grounding stage (a GroundingConfig of 0 steps and no
        # minutes would be refused; BENCHMARKS' centroid commands once failed there after the SIDs)
        grounding=dict(max_steps=args.grounding_steps, max_minutes=args.grounding_minutes)
        if grounds
        else False,
        sft=dict(max_steps=args.sft_steps, max_minutes=args.minutes or None, sid_softmax=sid_softmax),
        lora=model_config(args).lora(),
        evaluation=EvalSettings(
            users=args.run_eval_users,
            num_beams=args.serving.k,
            ks=(args.serving.k,),
            seed=args.training.seed,
            bf16=bf16,
        ),
        weights_dtype="bfloat16" if bf16 else "float32",
        max_train_examples=args.data.max_examples or None,
        max_grounding_examples=args.data.max_examples or None,
        start=args.start,
    )
    return budget


def plan(args, grounds: bool) -> str:
    per_model = args.minutes + (args.grounding_minutes if grounds else 0.0)
    lines = [
        f"Plan ({'SMOKE: a path check, not a measurement' if args.smoke else 'full protocol'}):",
        f"  objective {args.prompt.objective} (max_history {args.prompt.max_history}, max_length "
        f"{args.training.max_length}), strategy {args.strategy}, LoRA r {args.model.lora_r}/alpha "
        f"{args.model.lora_alpha} all-linear, lr {args.training.learning_rate}, "
        f"{f'the first {args.model.layers} blocks' if args.model.layers else 'all blocks'}, "
        f"{'SID-only softmax' if args.training.sid_softmax else 'full softmax'}, init_scale "
        f"{args.start.init_scale:g}, SIDs from {args.vectors.item_vectors} ({args.sids.levels} x {args.sids.codes}), "
        f"batch {args.training.per_device_train_batch_size}, {'float32' if args.fp32 else 'bf16 base + bf16 autocast'}, "
        f"examples {'all' if not args.data.max_examples else args.data.max_examples}",
        "  1. encode the catalogue (MiniLM), build SIDs on the old items and on the full catalogue, add the "
        "new items (~1-2 min)",
        "  2. train the old-catalogue model: "
        + (f"{args.grounding_minutes:g} min grounding + " if grounds else "")
        + f"{args.minutes:g} min SFT (+ model loading and the runner's {args.run_eval_users}-user eval)",
        f"  3. train the full-catalogue reference at the same budget: {per_model:g} min (+ the same overheads)",
        f"  4. grow, decode the scored new-item test users (grown, {args.serving.num_beams} beams; new-item slots "
        f"{args.new_item_share} re-rank its beams), {args.incremental_steps} incremental grounding steps per "
        f"replay {args.replay}, decode again; decode with the reference; popularity; bootstrap ({args.rounds} rounds)",
        f"  training {2 * per_model:g} min in all; expected total ~{2 * per_model + (1 if args.smoke else 5):.0f} "
        "min on one thread",
    ]
    return "\n".join(lines)


def protocol_indices(
    catalogue,
    old_catalogue,
    new_ids: list[str],
    vectors: np.ndarray,
    args: Settings,
    encoder_fingerprint: dict,
) -> tuple[SIDIndex, SIDIndex, SIDIndex | None, float]:
    """The SIDs of the old items (``parent``, built on ``old_catalogue``: the old items and their
    interactions only), that index grown by the new items (``child``), the full catalogue's own index for the
    retrained reference (None with ``--no-retrained``) and the seconds ``add_items`` took. ``vectors``: the
    catalogue's text vectors, one row per item in catalogue order. The SIDs are built at seed 0 whatever the
    training seed, so the seeds of one protocol share their codes."""
    row = {i: r for r, i in enumerate(catalogue.items)}
    settings = dict(
        levels=args.sids.levels,
        codes=BuildSIDsArguments.code_counts(args.sids),  # the package's reading of --codes
        text_template=TextTemplate(),
        show_progress=False,
        encoder_fingerprint=encoder_fingerprint,
        item_vectors=args.vectors,
    )
    parent = build_sids(old_catalogue, vectors=vectors[[row[i] for i in old_catalogue.items]], **settings)
    start = time.perf_counter()
    child = add_items(
        parent,
        [catalogue.items[i] for i in new_ids],
        vectors=vectors[[row[i] for i in new_ids]],
        encoder=encoder_fingerprint,
    )
    add_seconds = time.perf_counter() - start
    full_index = None if args.no_retrained else build_sids(catalogue, vectors=vectors, **settings)
    return parent, child, full_index, add_seconds


def main(argv=None) -> None:
    args = parse_args(argv)
    seed = args.training.seed  # the run's, and that of the samples and the bootstrap
    budget = protocol_budget(args)  # checked before the SIDs are built (parse_args built it once already)
    grounds = strategy(args.strategy).ground
    print(plan(args, grounds), flush=True)
    started = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # the packaged base, or with --layers its first N blocks written once to OUT/base-N-blocks
    model_path = model_config(args).model_path(out) or str(assets.smollm2())
    bf16 = not args.fp32

    catalogue = load_catalogue(args.dataset)
    seen = first_seen(catalogue, args.dataset)
    order = sorted(catalogue.items, key=lambda i: (seen[i], i))
    n_new = max(1, round(args.share * len(order)))
    old_ids, new_ids = order[:-n_new], order[-n_new:]
    new = set(new_ids)
    old_catalogue = catalogue.subset(old_ids)
    fmt = prompt_format(args)
    split = catalogue.leave_one_out()
    pool = new_item_examples(split, new, fmt.max_history, args.positions)
    examples = random.Random(seed).sample(pool, min(args.users, len(pool))) if args.users else list(pool)
    targets = [e[2] for e in examples]
    scored_users = {e[0] for e in pool}
    old_pool = [
        e for e in split.test_examples(fmt.max_history) if e[2] not in new and e[0] not in scored_users
    ]
    old_examples = random.Random(seed).sample(old_pool, min(args.old_users, len(old_pool)))
    old_targets = [e[2] for e in old_examples]
    where = "test target" if args.positions == "test" else "test or validation target"
    print(
        f"{catalogue.name}: {len(order)} items, {n_new} newest held out; {len(pool)} users have a new item as "
        f"{where}; scoring {len(examples)}"
        + ("" if len(examples) == len(pool) else f" (a seeded sample, --users {args.users})"),
        flush=True,
    )

    encoder = load_encoder("minilm")
    vectors = encode_texts(
        TextTemplate().render_all(list(catalogue.items.values())), encoder, show_progress=False
    )
    parent, child, full_index, add_seconds = protocol_indices(
        catalogue, old_catalogue, new_ids, vectors, args, encoder.fingerprint()
    )
    print(f"SIDs ready ({time.perf_counter() - started:.0f} s)", flush=True)

    timings: dict[str, float] = {}
    trained = (("old", old_catalogue, parent), ("full", catalogue, full_index))
    for name, cat, index in trained[: 1 if args.no_retrained else 2]:
        t = time.perf_counter()
        run_strategy(
            args.strategy, Experiment(model_path, cat, index, fmt=fmt), budget, out / name, resume=True
        )
        timings[f"train_{name}_s"] = round(time.perf_counter() - t, 1)
        print(f"{name} model trained ({timings[f'train_{name}_s']:.0f} s)", flush=True)

    results: dict[str, dict] = {}
    old_results: dict[str, dict] = {}  # the same models on test users whose target is an old item
    dtype = torch.bfloat16 if bf16 else torch.float32

    top = default_match_levels(child)  # the library's default, and one code fewer
    match_levels = args.match_levels or sorted({max(top - 1, 1), top})
    histories = {"new": full_histories(split, examples), "old": full_histories(split, old_examples)}
    item_ids = list(catalogue.items)
    t = time.perf_counter()
    logged = logged_pairs(split, args.positions)  # what serving logged since the model trained
    mixture = SemanticMixture.fit(item_ids, vectors, new_ids, logged)
    choice: dict = {}
    timings["fit_mixture_s"] = round(time.perf_counter() - t, 2)
    mixture_fit = {"temperature": mixture.temperature, "weights": mixture.weights.tolist()}
    print(f"semantic mixture calibrated: {mixture_fit}", flush=True)

    def score_both(name: str, model, index, adapter: Path | None = None) -> None:
        model.eval()
        t = time.perf_counter()
        slug = name.replace(" ", "_").replace("(", "").replace(")", "")
        lists = {
            part: cached_decode(
                out / f"beams-{slug}-{part}.json",
                adapter,
                lambda part=part: decode(
                    model, tokenizer, histories[part], index, catalogue, fmt, args.serving.num_beams, bf16
                ),
                chosen,
                args.serving.num_beams,
            )
            for part, chosen in (("new", examples), ("old", old_examples))
        }
        timings[f"decode_{name}_s"] = round(time.perf_counter() - t, 1)

        def route(recs, part, rule=None):  # what `recommend` and `evaluate` serve, these beams first
            return served(
                model, tokenizer, histories[part], index, catalogue, fmt, recs, args.serving.k, bf16, rule
            )

        variants = {name: route}
        if name.startswith("grown + tuned on the log"):  # its beams under the served rule
            variants[f"{name}, served"] = lambda recs, part: route(
                recs, part, NewItemRule(mixture, index.fingerprint())
            )
            weighed = NewItemRule(mixture, index.fingerprint())  # its model weight fitted on the held-out log
            held = [list(h) for h, _ in choice_pairs]
            with decoding(model, bf16):
                news = new_item_beams(
                    model,
                    tokenizer,
                    index,
                    held,
                    new_ids,
                    args.serving.num_beams,
                    fmt=fmt,
                    catalogue=catalogue,
                    batch_size=8,
                )
            weight_choice.update(weighed.choose_model_weight(news, held, [t for _, t in choice_pairs]))
            print(f"model weight fitted on {len(held)} held-out logged pairs: {weight_choice}", flush=True)
            variants[f"{name}, served, new items by text x model"] = lambda recs, part: route(
                recs, part, weighed
            )
        if name == "grown":
            for levels in match_levels:
                for share in args.new_item_share:
                    variants[f"grown + new-item slots (share {share:g}, {levels} codes)"] = (
                        lambda recs, part, rule=(share, levels): (
                            mix_new_items(
                                recs, index, new_ids, share=rule[0], match_levels=rule[1], k=args.serving.k
                            ).items
                        )
                    )
            for share in args.new_item_share:
                variants[f"grown + random new-item slots (share {share:g}, control)"] = (
                    lambda recs, part, share=share: random_slots(recs, new_ids, share, args.serving.k, seed)
                )
            variants["grown + semantic mixture"] = lambda recs, part: (
                mixture.mix(recs, histories[part], args.serving.k).items
            )
            variants[SERVED] = lambda recs, part: route(recs, part, NewItemRule(mixture, index.fingerprint()))
            if args.choice_users:
                sample = random.Random(seed).sample(logged, min(args.choice_users, len(logged)))
                logged_examples = [(f"log-{i}-{t}", list(h), t) for i, (h, t) in enumerate(sample)]
                logged_beams = cached_decode(
                    out / "beams-grown-logged.json",
                    adapter,
                    lambda: decode(
                        model,
                        tokenizer,
                        [e[1] for e in logged_examples],
                        index,
                        catalogue,
                        fmt,
                        args.serving.num_beams,
                        bf16,
                    ),
                    logged_examples,
                    args.serving.num_beams,
                )
                log_rule = NewItemRule(mixture, index.fingerprint())
                choice.update(
                    log_rule.choose_beams(
                        logged_beams,
                        [e[1] for e in logged_examples],
                        [e[2] for e in logged_examples],
                        args.serving.k,
                    )
                )
                print(f"served rule's beams chosen on {len(sample)} logged pairs: {choice}", flush=True)
                variants[CHOSEN] = lambda recs, part: route(recs, part, log_rule)  # model or text beams
        for label, rule in variants.items():
            for part, table, wanted in (("new", results, targets), ("old", old_results, old_targets)):
                table[label] = score(rule(lists[part], part), wanted, new, args.serving.k)

    incremental: dict[str, dict] = {}
    weight_choice: dict = {}
    choice_pairs, tuning_pairs = held_out_log(logged) if args.log_steps else ([], [])
    arms: list = [None, *args.replay] + (["log"] if args.log_steps else [])
    for replay in arms:  # None: grown, no incremental grounding; "log": tuned on the logged pairs
        tokenizer, model = sid_model(
            model_path, parent, adapter=str(out / "old" / "sft" / "adapter"), dtype=dtype
        )
        grown = grow_adapter(model, tokenizer, parent, child)
        name = "grown"
        if replay == "log":
            name = f"grown + tuned on the log ({args.log_steps} steps)"
            inc = tune_new_items_on_log(
                grown,
                tokenizer,
                parent,
                child,
                catalogue,
                tuning_pairs,
                max_steps=args.log_steps,
                learning_rate=args.log_lr or args.training.learning_rate,
                batch_size=args.training.per_device_train_batch_size,
                seed=seed,
                bf16=bf16,
            )
            incremental[name] = {
                "seconds": round(inc.seconds, 2),
                "rows": len(inc.trained_rows),
                "examples": inc.n_examples,
                "loss_first_last": [inc.losses[0], inc.losses[-1]] if inc.losses else [],
            }
        elif replay is not None:
            name = "grown + incremental " + ("(new items alone)" if not replay else f"(replay {replay:g})")
            inc = ground_new_items(  # an IncrementalGroundingConfig from these fields
                grown,
                tokenizer,
                parent,
                child,
                catalogue,
                replay=replay,
                max_steps=args.incremental_steps,
                per_device_train_batch_size=args.training.per_device_train_batch_size,
                learning_rate=args.incremental_lr or args.training.learning_rate,
                seed=seed,
                bf16=bf16,
            )
            incremental[name] = {
                "seconds": round(inc.seconds, 2),
                "rows": len(inc.trained_rows),
                "replayed_items": inc.n_replayed,
                "examples": inc.n_examples,
            }
        score_both(name, grown, child, out / "old" / "sft" / "adapter" if replay is None else None)
        del grown, model

    if not args.no_retrained:
        tokenizer, full = sid_model(
            model_path, full_index, adapter=str(out / "full" / "sft" / "adapter"), dtype=dtype
        )
        score_both("retrained (full catalogue)", full, full_index, out / "full" / "sft" / "adapter")
    for part, table, wanted in (("new", results, targets), ("old", old_results, old_targets)):
        for name, lists in control_lists(
            mixture, histories[part], args.serving.k, args.serving.num_beams, "share"
        ).items():
            table[name] = score(lists, wanted, new, args.serving.k)
    for profile in ("last", "recency"):  # the peers a shop has without any model: no training at all
        knn = TextKNN(item_ids, vectors, profile=profile)
        results[knn.name] = score(
            knn.recommend(histories["new"], args.serving.k), targets, new, args.serving.k
        )
        old_results[knn.name] = score(
            knn.recommend(histories["old"], args.serving.k), old_targets, new, args.serving.k
        )
    counts = Counter(old_catalogue.leave_one_out().training_target_counts())
    top = [i for i, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[: args.serving.k]]
    results["popularity"] = score([top] * len(targets), targets, new, args.serving.k)
    old_results["popularity"] = score([top] * len(old_targets), old_targets, new, args.serving.k)

    k = args.serving.k
    metrics = (f"recall@{k}", f"ndcg@{k}")
    arrays = {(name, m): r["per_user"][m].astype(np.float64) for name, r in results.items() for m in metrics}
    pairs = {} if args.no_retrained else {"grown - retrained": ("grown", "retrained (full catalogue)")}
    pairs |= {
        f"{name.removeprefix('grown + ')} - grown": (name, "grown")
        for name in [*incremental, *(n for n in results if "new-item slots" in n or "mixture" in n)]
    }
    pairs |= {
        f"{mix.removeprefix('grown + ')} - {knn}": (mix, knn)
        for mix in ("grown + semantic mixture", "grown + semantic mixture (share)")
        for knn in ("text KNN (last item)", "text KNN (recency)")
    }
    pairs |= {
        f"served: {SERVED.removeprefix('grown + ')} - {control}": (SERVED, control)
        for control in (TEXT_ONLY, P_TEXT)
    }
    if CHOSEN in results:
        pairs |= {
            f"{CHOSEN.removeprefix('grown + ')} - {c}": (CHOSEN, c) for c in (TEXT_ONLY, P_TEXT, "grown")
        }
    tuned = [n for n in results if n.startswith("grown + tuned on the log") and ", served" in n]
    pairs |= {
        f"{t.removeprefix('grown + ')} - {c}": (t, c) for t in tuned for c in (TEXT_ONLY, P_TEXT, SERVED)
    }
    pairs |= {  # the model's weight alone: the same tuned rows and beams, new items by text x model or text
        f"{t.removeprefix('grown + ')} - text alone": (t, t.removesuffix(", new items by text x model"))
        for t in tuned
        if t.endswith("text x model")
    }
    for label, (a, b) in pairs.items():
        for m in metrics:
            arrays[(label, m)] = arrays[(a, m)] - arrays[(b, m)]
    old_pairs = {  # what a rule costs the users whose target is an old item (paired, same users)
        f"{name.removeprefix('grown + ')} - grown": (name, "grown")
        for name in old_results
        if name.startswith("grown + ") and ("slots" in name or "mixture" in name)
    }
    old_pairs |= {f"served - {c}": (SERVED, c) for c in (TEXT_ONLY, P_TEXT)}
    if CHOSEN in old_results:
        old_pairs |= {f"{CHOSEN.removeprefix('grown + ')} - {c}": (CHOSEN, c) for c in (TEXT_ONLY, P_TEXT)}
    old_pairs |= {f"{t.removeprefix('grown + ')} - {c}": (t, c) for t in tuned for c in (TEXT_ONLY, SERVED)}
    old_differences = {}
    for label, (a, b) in old_pairs.items():
        m = f"recall@{args.serving.k}"
        diff = old_results[a]["per_user"][m] - old_results[b]["per_user"][m]
        old_differences[label] = {
            m: float(diff.mean()),
            f"{m}_ci95": interval(diff, seed, args.rounds),
        }
    for name, r in results.items():
        for m in metrics:
            r[f"{m}_ci95"] = interval(arrays[(name, m)], seed, args.rounds)
    differences = {  # paired: the interval of the per-user differences resamples the same users for both
        label: {m: float(arrays[(label, m)].mean()) if len(targets) else float("nan") for m in metrics}
        | {f"{m}_ci95": interval(arrays[(label, m)], seed, args.rounds) for m in metrics}
        for label in pairs
    }
    weight = len(pool) / (len(pool) + len(old_pool))  # the new-item users' share of the population
    m = f"recall@{args.serving.k}"
    everyone = {}
    if len(targets) and len(old_targets):
        both = {
            name: (results[name]["per_user"][m], old_results[name]["per_user"][m]) for name in old_results
        }
        rules = [SERVED, *([CHOSEN] if CHOSEN in both else []), *tuned]
        for name in (*rules, TEXT_ONLY, P_TEXT, "grown", "text KNN (last item)", "popularity"):
            everyone[name] = blended(*both[name], weight, seed, args.rounds)
        for rule_name in rules:
            controls = (TEXT_ONLY, P_TEXT, "grown", "text KNN (last item)")
            for control in (*controls, SERVED) if rule_name in tuned else controls:
                new_diff = both[rule_name][0] - both[control][0]
                old_diff = both[rule_name][1] - both[control][1]
                label = (
                    f"{'served' if rule_name == SERVED else rule_name.removeprefix('grown + ')} - {control}"
                )
                everyone[label] = blended(new_diff, old_diff, weight, seed, args.rounds)
    timings["total_s"] = round(time.perf_counter() - started, 1)

    per_user_ranks = {
        "users": [e[0] for e in examples],
        "targets": targets,
        "rank_of_target": {name: r["per_user"]["rank"].tolist() for name, r in results.items()},
        "old_item_users": [e[0] for e in old_examples],
        "old_item_rank_of_target": {name: r["per_user"]["rank"].tolist() for name, r in old_results.items()},
    }
    for r in [*results.values(), *old_results.values()]:
        del r["per_user"]
    summary = {
        "dataset": catalogue.name,
        "items": len(order),
        "new_items": n_new,
        "positions": args.positions,
        "new_item_test_users": len(pool),
        "scored_users": len(examples),
        "smoke": args.smoke,
        "add_items_seconds": round(add_seconds, 3),
        "new_tokens": child.n_tokens - parent.n_tokens,
        "sids": {"item_vectors": args.vectors.item_vectors, "old_items": parent.quality},
        "format": {"objective": fmt.objective, "max_history": fmt.max_history},
        "budget": record(args),
        "timings": timings,
        "results": results,
        "old_item_users": {
            "scored": len(old_examples),
            "of": len(old_pool),
            "results": old_results,
            "paired_differences": old_differences,
        },
        "semantic_mixture": mixture_fit,
        "beams_choice": choice,
        "incremental": incremental,
        "model_weight_choice": weight_choice,
        "paired_differences": differences,
        "all_users": {"new_item_user_share": weight, f"{m}_and_ci95": everyone},
        "per_user": per_user_ranks,
    }
    (out / "protocol.json").write_text(json.dumps(summary, indent=1))
    scored = f"all {len(pool)}" if len(examples) == len(pool) else f"{len(examples)} of {len(pool)}"
    lines = [
        f"## New items on {catalogue.name}: {n_new} newest items held out, {scored} users with a new-item "
        f"{where} scored ({fmt.objective} objective, SIDs from {args.vectors.item_vectors}, {args.minutes:g} min SFT"
        + (f" + {args.grounding_minutes:g} min grounding" if grounds else "")
        + f" per trained model{', SMOKE' if args.smoke else ''})",
        "",
        f"| model | Recall@{k} [95% CI] | NDCG@{k} [95% CI] | share of slots to new items "
        f"| old-item users ({len(old_examples)}): Recall@{k} | their slots to new items |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        lo, hi = r[f"recall@{k}_ci95"]
        nlo, nhi = r[f"ndcg@{k}_ci95"]
        o = old_results[name]
        lines.append(
            f"| {name} | {r[f'recall@{k}']:.4f} [{lo:.4f}, {hi:.4f}] | {r[f'ndcg@{k}']:.4f} [{nlo:.4f}, {nhi:.4f}] "
            f"| {r['new_item_slot_share']:.3f} | {o[f'recall@{k}']:.4f} | {o['new_item_slot_share']:.3f} |"
        )
    lines += ["", f"| paired difference | Recall@{k} [95% CI] | NDCG@{k} [95% CI] |", "|---|---|---|"]
    for label, d in differences.items():
        lo, hi = d[f"recall@{k}_ci95"]
        nlo, nhi = d[f"ndcg@{k}_ci95"]
        lines.append(
            f"| {label} | {d[f'recall@{k}']:+.4f} [{lo:+.4f}, {hi:+.4f}] "
            f"| {d[f'ndcg@{k}']:+.4f} [{nlo:+.4f}, {nhi:+.4f}] |"
        )
    lines += ["", f"| old-item users, paired | Recall@{k} [95% CI] |", "|---|---|"]
    for label, d in old_differences.items():
        lo, hi = d[f"recall@{k}_ci95"]
        lines.append(f"| {label} | {d[f'recall@{k}']:+.4f} [{lo:+.4f}, {hi:+.4f}] |")
    if everyone:
        lines += [
            "",
            f"| all users ({weight:.1%} with a new-item target, the groups weighted so) | Recall@{k} [95% CI] |",
            "|---|---|",
        ]
        lines += [f"| {label} | {v:+.4f} [{lo:+.4f}, {hi:+.4f}] |" for label, (v, lo, hi) in everyone.items()]
    lines += [
        "",
        f"Semantic mixture calibrated on the position before the scored one: {mixture_fit}.",
        f"Served rule's beams chosen on a seeded sample of those logged pairs (NewItemRule.choose_beams): {choice}.",
        f"Intervals: percentile bootstrap over users ({args.rounds} resamples, seed {seed}; the paired "
        "rows resample the same users for both models).",
        f"add_items: {add_seconds:.3f} s, {summary['new_tokens']} new tokens; incremental grounding "
        f"({args.incremental_steps} steps, lr {args.incremental_lr or args.training.learning_rate:g}): {incremental}. New items are {len(new_ids) / len(order):.0%} of the "
        f"catalogue and the {where}s of {len(pool) / (len(pool) + len(old_pool)):.1%} of the users. "
        f"Timings (s): {timings}.",
    ]
    (out / "protocol.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
