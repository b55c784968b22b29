"""Model card of a grounded adapter, rendered from the package's template (``peft_grounded/hub/templates/
grounded_adapter.md``, also linked from ``model_cards/``) with ``huggingface_hub``.

>>> card = render_model_card({"base_model": "HuggingFaceTB/SmolLM2-135M", "repo_id": "user/sid-adapter",
...                           "sid": {"codes_per_level": [256, 256, 256]}, "init": {"name": "centroid"}})
>>> card.push_to_hub("user/sid-adapter")  # or card.save("README.md")

The facts it is rendered from, derived from an adapter's config and its SID index and merged with the
user's own (:func:`derive_card_facts`), are below.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from huggingface_hub import ModelCard, ModelCardData

from ..sids.index import DEFAULT_TEMPLATE, level_name, sid_string, sid_token, sid_vocabulary

if TYPE_CHECKING:
    from ..adapter import GroundedTokenConfig
    from ..sids.index import SIDIndex


TEMPLATE_NAME = "grounded_adapter.md"


def template_candidates() -> list[Path]:
    """Where the template is: package data of :mod:`peft_grounded.hub` (``templates/``), found by
    ``importlib.resources`` in a checkout, an editable install or a wheel alike."""
    return [Path(str(resources.files(__package__) / "templates" / TEMPLATE_NAME))]


def find_template() -> Path:
    """The first existing template candidate, else the first candidate (so that errors name it)."""
    candidates = template_candidates()
    return next((path for path in candidates if path.is_file()), candidates[0])


TEMPLATE_PATH = find_template()
LOAD_HELPER = "peft_grounded.hub.load_grounded"
BASE_TAGS = ("peft", "peft_grounded", "semantic-ids", "generative-recommendation")


@dataclass
class SIDFacts:
    """The Semantic-ID scheme: ``codes_per_level`` (e.g. ``[256, 256, 256]``) and how tokens are named."""

    codes_per_level: Sequence[int]
    token_template: str = DEFAULT_TEMPLATE
    num_new_tokens: int | None = None  # defaults to sum(codes_per_level)
    quantiser: str | None = None  # e.g. "RQ-KMeans", "RQ-VAE"
    encoder: str | None = None  # text encoder of the items
    text_template: str | None = None  # item text given to the encoder
    index: str | None = None  # where the item -> SID index is (a file of the repo or a URL)


@dataclass
class InitFacts:
    """How the new rows were initialised: ``name`` (mean, gaussian, centroid, ...) and its parameters."""

    name: str
    description: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class GroundingFacts:
    """The grounding stage (GTI): data, number of steps and other settings (lr, batch size, templates...)."""

    data: str | None = None
    steps: int | None = None
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class GroundedCardFacts:
    """Everything the card can say; only ``base_model`` is required, the rest is shown when given."""

    base_model: str
    repo_id: str | None = None
    license: str = "apache-2.0"
    summary: str | None = None
    sid: SIDFacts | None = None
    init: InitFacts | None = None
    grounding: GroundingFacts | None = None
    lora: Mapping[str, Any] | None = None  # settings of a LoRA stacked on the grounded rows
    metrics: Mapping[str, Any] = field(default_factory=dict)
    eval_setup: str | None = None  # one sentence on the protocol behind ``metrics``
    diagnostics: Mapping[str, Any] = field(default_factory=dict)
    datasets: Sequence[str] = ()
    language: str | Sequence[str] | None = None
    tags: Sequence[str] = ()
    load_helper: str = LOAD_HELPER

    @classmethod
    def from_dict(cls, facts: Mapping[str, Any]) -> GroundedCardFacts:
        """Build from plain (e.g. JSON) data; nested ``sid``/``init``/``grounding`` may be dicts."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(facts) - known
        if unknown:
            raise ValueError(f"unknown model card facts: {sorted(unknown)} (known: {sorted(known)})")
        kwargs = dict(facts)
        for name, kind in (("sid", SIDFacts), ("init", InitFacts), ("grounding", GroundingFacts)):
            if isinstance(kwargs.get(name), Mapping):
                kwargs[name] = kind(**kwargs[name])
        return cls(**kwargs)


def _fmt(value: Any) -> str:
    """Table cell text: floats to 4 significant digits, sequences comma-joined, pipes escaped."""
    if isinstance(value, bool) or value is None:
        text = str(value)
    elif isinstance(value, float):
        text = f"{value:.4g}"
    elif isinstance(value, (list, tuple)):
        text = ", ".join(_fmt(v) for v in value)
    else:
        text = str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def _table(values: Mapping[str, Any]) -> dict[str, str]:
    return {str(k): _fmt(v) for k, v in values.items() if v is not None}


def _stage_vars(stage: InitFacts | GroundingFacts | None) -> dict[str, Any] | None:
    """A stage's fields for the template, its ``params`` as a table."""
    if stage is None:
        return None
    return {**dataclasses.asdict(stage), "params": _table(stage.params)}


def _sid_vars(sid: SIDFacts) -> dict[str, Any]:
    codes = [int(c) for c in sid.codes_per_level]
    if not codes or min(codes) < 1:
        raise ValueError(f"codes_per_level must be positive, got {codes}")
    shape = f"{len(codes)} x {codes[0]}" if len(set(codes)) == 1 else " / ".join(map(str, codes))
    return {
        "shape": shape,
        "token_template": sid.token_template,
        "first_token": sid_token(0, 0, sid.token_template),
        "last_token": sid_token(len(codes) - 1, codes[-1] - 1, sid.token_template),
        "example": sid_string(
            [min(c - 1, 7 * level + 3) for level, c in enumerate(codes)], sid.token_template
        ),
        "num_new_tokens": sid.num_new_tokens if sid.num_new_tokens is not None else sum(codes),
        "quantiser": sid.quantiser,
        "encoder": sid.encoder,
        "text_template": sid.text_template,
        "index": sid.index,
    }


def card_tags(facts: GroundedCardFacts) -> list[str]:
    """The card's tags: peft, peft_grounded, ``base_model:adapter:<base>``, then the extra ones."""
    tags = [*BASE_TAGS, f"base_model:adapter:{facts.base_model}"]
    if facts.lora:
        tags.append("lora")
    return list(dict.fromkeys([*tags, *facts.tags]))


def render_model_card(
    facts: GroundedCardFacts | Mapping[str, Any], template_path: str | Path | None = None
) -> ModelCard:
    """Render the grounded-adapter model card (YAML metadata + sections) from ``facts``."""
    from .. import __version__

    if not isinstance(facts, GroundedCardFacts):
        facts = GroundedCardFacts.from_dict(facts)
    if template_path is not None:
        template = Path(template_path)
        if not template.is_file():
            raise FileNotFoundError(f"model card template not found: {template}")
    else:
        template = find_template()
        if not template.is_file():
            looked = ", ".join(str(p) for p in template_candidates())
            raise FileNotFoundError(
                f"model card template {TEMPLATE_NAME} not found (looked in: {looked}). Reinstall peft-grounded "
                "from a wheel or a checkout (the template ships as a data file), or pass template_path=."
            )
    card_data = ModelCardData(
        base_model=facts.base_model,
        library_name="peft",
        license=facts.license,
        pipeline_tag="text-generation",
        tags=card_tags(facts),
        datasets=list(facts.datasets) or None,
        language=facts.language,
    )
    module, _, _ = facts.load_helper.rpartition(".")
    name = facts.repo_id or "<user>/<repo>"  # only shown inside code blocks
    title = facts.repo_id or f"Grounded Semantic-ID adapter for {facts.base_model}"
    summary = facts.summary or (
        f"A `peft_grounded` adapter for `{facts.base_model}`: it adds Semantic-ID (SID) tokens to the "
        "vocabulary and stores the trained embedding rows of those tokens only, so that the model can "
        "read and generate item SIDs for generative recommendation."
    )
    card = ModelCard.from_template(
        card_data,
        template_path=str(template),
        title=title,
        model_id=name,
        summary=summary,
        lora=_table(facts.lora) if facts.lora else None,
        sid=_sid_vars(facts.sid) if facts.sid else None,
        init=_stage_vars(facts.init),
        grounding=_stage_vars(facts.grounding),
        metrics=_table(facts.metrics),
        eval_setup=facts.eval_setup,
        diagnostics=_table(facts.diagnostics),
        load_helper=facts.load_helper,
        load_module=module or facts.load_helper,
        peft_grounded_version=__version__,
    )
    # Optional sections leave no trace: squeeze the blank lines that skipped blocks may leave behind.
    return ModelCard(re.sub(r"\n{3,}", "\n\n", str(card)).rstrip() + "\n")


# Model-card facts derived from an adapter's config and its SID index, merged with the user's own.

INIT_DESCRIPTIONS = {
    "mean": "the mean of the base vocabulary's rows",
    "gaussian": "draws from a Gaussian fitted to the base vocabulary's rows",
    "random": "the model's own random initialiser",
    "description": "per token, the mean embedding of a text describing it",
    "centroid": "per-token centroids of the items' text embeddings, projected to the model's width",
    "tensor": "given vectors",
    "adapter": "the rows of another grounded adapter",
    "keep": "the rows the base held (a no-op start)",
}


def init_facts(config: GroundedTokenConfig) -> dict[str, Any]:
    if not config.init_weights:  # PEFT's meaning: random rows, whatever `init` says
        return {"name": "randn", "description": "random rows, torch.randn (init_weights=False)", "params": {}}
    params: dict[str, Any] = {}
    if config.init in ("gaussian", "random"):
        params["seed"] = config.init_seed
    if config.init == "centroid":
        params |= {"projection": config.centroid_projection, "norm_match": config.norm_match}
    if config.init_scale != 1.0 and config.init != "adapter":
        params["init_scale"] = config.init_scale
    return {"name": config.init, "description": INIT_DESCRIPTIONS.get(config.init), "params": params}


def lora_facts(config: GroundedTokenConfig) -> dict[str, Any] | None:
    """The stacked LoRA's settings for the card (r, alpha, dropout and targets first, other options after)."""
    if config.lora is None:
        return None
    lora = dict(config.lora)
    main = {
        "r": lora.pop("r", 8),  # peft.LoraConfig's default rank
        "lora_alpha": lora.pop("lora_alpha", 8),
        "lora_dropout": lora.pop("lora_dropout", 0.0),
        "target_modules": lora.pop("target_modules"),
    }
    return main | lora


def codes_from_tokens(tokens: list[str]) -> list[int] | None:
    """``codes_per_level`` if ``tokens`` are exactly a default-template SID vocabulary (``<a_0>`` ...)."""
    levels: Counter[str] = Counter(t[1 : t.index("_")] for t in tokens if t.startswith("<") and "_" in t)
    codes = []
    while level_name(len(codes)) in levels:
        codes.append(levels[level_name(len(codes))])
    try:
        return codes if codes and sid_vocabulary(codes, DEFAULT_TEMPLATE) == tokens else None
    except ValueError:
        return None


def sid_facts(
    config: GroundedTokenConfig, index: SIDIndex | None, index_pointer: str | None
) -> dict[str, Any] | None:
    if index is None:
        codes = codes_from_tokens(list(config.token_strings or []))
        if codes is None:
            return None
        return {"codes_per_level": codes, "num_new_tokens": len(config.token_indices), "index": index_pointer}
    text = index.text_template or {}
    return {
        "codes_per_level": list(index.codes_per_level),
        "token_template": index.token_template,
        "num_new_tokens": len(config.token_indices),
        "quantiser": "RQ-KMeans" + (" + a disambiguation level" if index.disambiguation_level else ""),
        "encoder": index.encoder.get("model"),
        "text_template": f"fields: {', '.join(text['fields'])}" if text.get("fields") else None,
        "index": index_pointer,
    }


def derive_card_facts(
    config: GroundedTokenConfig,
    *,
    base_model: str,
    repo_id: str,
    index: SIDIndex | None = None,
    index_pointer: str | None = None,
    overrides: GroundedCardFacts | Mapping[str, Any] | None = None,
) -> GroundedCardFacts:
    """What the adapter says about itself (base, SID scheme, initialisation, LoRA), then ``overrides`` on top
    (a mapping replaces whole entries; a :class:`GroundedCardFacts` is used as given, its repo id filled in)."""
    if isinstance(overrides, GroundedCardFacts):
        return dataclasses.replace(overrides, repo_id=overrides.repo_id or repo_id)
    facts: dict[str, Any] = {
        "base_model": base_model,
        "repo_id": repo_id,
        "sid": sid_facts(config, index, index_pointer),
        "init": init_facts(config),
        "lora": lora_facts(config),
    }
    return GroundedCardFacts.from_dict({**facts, **dict(overrides or {})})
