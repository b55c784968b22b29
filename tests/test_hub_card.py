"""The grounded-adapter model card: template packaged in peft_grounded/hub/templates/ (model_cards/ links to it),
renderer in peft_grounded.hub.card."""

from __future__ import annotations

import re

import pytest
from huggingface_hub import HfApi, ModelCard

from peft_grounded.hub.card import (
    TEMPLATE_PATH,
    GroundedCardFacts,
    InitFacts,
    SIDFacts,
    render_model_card,
)

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
OPTIONAL = (
    "## Semantic-ID vocabulary",
    "## Initialisation",
    "## Grounding",
    "## Evaluation",
    "## Diagnostics",
)
ALWAYS = ("## Base model", "## How to load", "## License", "## Citation")

FULL = {
    "base_model": BASE,
    "repo_id": "user/ml100k-sid",
    "license": "mit",
    "sid": {
        "codes_per_level": [256, 256, 256],
        "quantiser": "RQ-KMeans",
        "encoder": "sentence-transformers/all-MiniLM-L6-v2",
        "text_template": "{title} | {genres}",
        "index": "`sid_index.json` in this repo",
    },
    "init": {
        "name": "centroid",
        "description": "codebook vectors, mean-shifted",
        "params": {"mean_shift": True},
    },
    "grounding": {
        "data": "MovieLens-100K",
        "steps": 2000,
        "params": {"lr": 1e-3, "templates": ["title -> SID"]},
    },
    "lora": {"r": 8, "target_modules": ["q_proj", "v_proj"]},
    "metrics": {"Recall@5": 0.0523456, "NDCG@10": 0.031, "note": "a|b"},
    "eval_setup": "Leave-one-out, full ranking.",
    "diagnostics": {"P_10": 0.61, "effective rank": 87.2},
    "datasets": ["recbole/ml-100k"],
    "tags": ["movielens"],
}


def _sections(text: str) -> dict[str, str]:
    """Body text of every '## ' section (up to the next '## ' heading or the end)."""
    parts = re.split(r"^(## .+)$", text, flags=re.MULTILINE)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def _assert_clean(card: ModelCard) -> None:
    text = str(card)
    assert text.startswith("---\n") and "\n\n\n" not in text
    assert "{{" not in text and "{%" not in text and "None" not in text
    for heading, body in _sections(card.text).items():
        assert body.strip(), f"empty section {heading}"


def test_full_facts_render_every_section_with_metadata():
    card = render_model_card(FULL)
    data = card.data.to_dict()
    assert data["base_model"] == BASE and data["library_name"] == "peft" and data["license"] == "mit"
    assert data["pipeline_tag"] == "text-generation" and data["datasets"] == ["recbole/ml-100k"]
    for tag in ("peft", "peft_grounded", f"base_model:adapter:{BASE}", "lora", "movielens"):
        assert tag in data["tags"]
    sections = _sections(card.text)
    for heading in (*OPTIONAL, *ALWAYS):
        assert heading in sections
    sid = sections["## Semantic-ID vocabulary"]
    assert (
        "3 x 256" in sid
        and "| 768 |" in sid
        and "`<a_0>` ... `<c_255>`" in sid
        and "{title} | {genres}" in sid
    )
    assert "**centroid**: codebook vectors, mean-shifted" in sections["## Initialisation"]
    assert "MovieLens-100K, for 2000 steps" in sections["## Grounding"] and "| lr | 0.001 |" in card.text
    assert "| Recall@5 | 0.05235 |" in card.text and "| note | a\\|b |" in card.text  # pipes escaped
    assert "| effective rank | 87.2 |" in sections["## Diagnostics"]
    load = sections["## How to load"]
    assert "import peft_grounded" in load and 'PeftModel.from_pretrained(base, "user/ml100k-sid")' in load
    assert 'peft_grounded.hub.load_grounded(base, tokenizer, "user/ml100k-sid")' in load
    assert "2604.02324" in sections["## Citation"] and "2608.07816" in sections["## Citation"]
    assert card.text.lstrip().startswith("# user/ml100k-sid")
    _assert_clean(card)
    # The rendered file parses back to the same metadata (what the Hub reads from README.md).
    assert ModelCard(str(card)).data.to_dict() == data


def test_minimal_facts_omit_optional_sections_cleanly():
    card = render_model_card({"base_model": "org/base"})
    for heading in OPTIONAL:
        assert heading not in card.text
    sections = _sections(card.text)
    assert all(heading in sections for heading in ALWAYS)
    assert "base_model:adapter:org/base" in card.data.tags and "lora" not in card.data.tags
    assert "LoRA" not in card.text and "datasets" not in card.data.to_dict()
    _assert_clean(card)


def test_dataclass_facts_custom_helper_and_partial_sections():
    facts = GroundedCardFacts(
        base_model="org/base",
        repo_id="org/adapter",
        sid=SIDFacts(codes_per_level=[16, 16, 4], token_template="<sid_{level_index}_{code}>"),
        init=InitFacts(name="mean"),
        diagnostics={"RSA (Spearman)": 0.42},
        load_helper="peft_grounded.hub.pull_grounded",
    )
    card = render_model_card(facts)
    assert "16 / 16 / 4" in card.text and "`<sid_0_0>` ... `<sid_2_3>`" in card.text and "| 36 |" in card.text
    assert "import peft_grounded.hub\n" in card.text
    assert 'peft_grounded.hub.pull_grounded(base, tokenizer, "org/adapter")' in card.text
    assert (
        "## Diagnostics" in card.text and "## Evaluation" not in card.text and "## Grounding" not in card.text
    )
    assert "| Parameter |" not in card.text  # no empty parameter table for an init without parameters
    _assert_clean(card)


def test_bad_facts_are_refused():
    with pytest.raises(ValueError, match="unknown model card facts"):
        render_model_card({"base_model": "org/base", "metric": {}})
    with pytest.raises(ValueError, match="codes_per_level"):
        render_model_card({"base_model": "org/base", "sid": {"codes_per_level": []}})
    with pytest.raises(FileNotFoundError):
        render_model_card({"base_model": "org/base"}, template_path=TEMPLATE_PATH.with_name("absent.md"))


def test_card_pushed_to_the_loopback_hub_reads_back_as_metadata(hub_endpoint):
    api = HfApi()
    api.create_repo("user/ml100k-sid")
    render_model_card(FULL).push_to_hub("user/ml100k-sid")
    info = api.model_info("user/ml100k-sid")
    assert info.library_name == "peft" and "peft_grounded" in info.tags
    assert info.card_data["base_model"] == BASE
    assert ModelCard.load("user/ml100k-sid").text == render_model_card(FULL).text


def test_the_template_is_package_data_and_model_cards_links_to_it():
    """One copy: importlib.resources finds it in the package; model_cards/grounded_adapter.md, the folder people
    browse, is a link to that file, so the two cannot drift apart."""
    from importlib import resources
    from pathlib import Path

    packaged = resources.files("peft_grounded.hub") / "templates" / "grounded_adapter.md"
    assert Path(str(packaged)) == TEMPLATE_PATH and TEMPLATE_PATH.is_file()
    browsed = Path(__file__).resolve().parent.parent / "model_cards" / "grounded_adapter.md"
    assert browsed.is_symlink() and browsed.resolve() == TEMPLATE_PATH.resolve()


def test_the_cards_init_facts_name_a_scaled_start():
    from peft_grounded import GroundedTokenConfig
    from peft_grounded.hub.card import init_facts

    plain = init_facts(GroundedTokenConfig(token_indices=[5, 6], init="centroid"))
    assert plain["params"] == {"projection": "auto", "norm_match": True}
    scaled = init_facts(
        GroundedTokenConfig(token_indices=[5, 6], init="gaussian", init_scale=0.1, init_seed=3)
    )
    assert scaled["params"] == {"seed": 3, "init_scale": 0.1}


def test_the_cards_init_facts_name_random_rows_and_the_no_op_start():
    from peft_grounded import GroundedTokenConfig
    from peft_grounded.hub.card import init_facts

    drawn = init_facts(GroundedTokenConfig(token_indices=[5, 6], init="centroid", init_weights=False))
    assert drawn["name"] == "randn" and "init_weights=False" in drawn["description"]  # not "centroid"
    kept = init_facts(GroundedTokenConfig(token_indices=[5, 6], init="keep"))
    assert kept["name"] == "keep" and "no-op" in kept["description"]
