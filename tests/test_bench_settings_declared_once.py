"""A setting is declared once, the benchmark scripts included: a script's own settings dataclass declares no field
whose name is a field of one of the package's settings dataclasses; the script parses the package's declaration
instead (the dataclass itself, or :func:`benchmarks._args.package_fields` of it), under the package's flag.

Scripts join :data:`SCRIPTS` as they are brought to it (``bench_grow_protocol`` and ``bench_demo_recipe`` first);
the allow-lists hold only a knob whose name coincides with a package field of another meaning."""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from benchmarks import _args

SCRIPTS = (
    "bench_grow_protocol",
    "bench_demo_recipe",
    "bench_side_by_side",
    "bench_rqkmeans",
    "bench_item_vectors",
    "bench_quality",
    "bench_sid_softmax",
    "bench_objectives",
    "compare_adapters",
    "pool_demo_runs",
    "bench_step_limit",  # its Variant is a row type of the runs, not parsed
    "peft_common_matrix",  # its Column is a row type of the table, not parsed
    "bench_grow",
    "bench_decoding",
    "bench_fusion",
    "bench_kill_resume",
    "bench_start_nll",
    "bench_compile_blocks",
    "bench_graph_expert",
    "bench_recommend",
)

# the arguments a script's parse_args is checked with (its required ones): --out unless listed here
ARGV = {
    "bench_rqkmeans": [],
    "bench_item_vectors": [],
    "bench_quality": [],
    "bench_sid_softmax": [],
    "bench_objectives": ["--sid_index", "sids"],
    "compare_adapters": ["--sid_index", "sids", "--out", "x", "--adapter", "mean=a"],
    "pool_demo_runs": ["runs/demo"],
    "bench_step_limit": [],
    "peft_common_matrix": ["--peft_tests", "tests"],
    "bench_grow": [],
    "bench_decoding": [],
    "bench_fusion": ["--out", "x", "--valid", "v", "--test", "t", "--sids", "s", "--seeds", "0"],
    "bench_kill_resume": [],
    "bench_start_nll": ["--demo-dir", "x"],
    "bench_compile_blocks": [],
    "bench_graph_expert": ["--sid_index", "sids"],
    "bench_recommend": [],
}

# name -> why the script's field of that name is not the package's setting of that name
ALLOWED = {
    # _args.Precision (every benchmark script's --fp32 / --bf16): the whole script's precision, forced either way
    # or left to the machine: the frozen base's dtype and the autocast of decoding as well as of training, which
    # the script writes into each stage's bf16 (RecommendationConfig / GroundingConfig: one stage's mixed
    # precision) and the Budget's weights dtype; a Preset's bf16 is the demo's own choice of the same
    "bf16",
}
# script -> its fields whose name is a package field of another meaning there
ALLOWED_IN = {
    "compare_adapters": {
        "adapter"
    },  # NAME=DIRECTORY pairs, repeatable: many runs, not recommend's one adapter
    "peft_common_matrix": {"k"},  # pytest's -k expression, not recommend's list length
}


def package_settings() -> tuple[type, ...]:
    """The package's settings dataclasses: the commands' (their TRL parents' fields included), the stages', the
    runner's budget, the demo's preset, and those the recipes name."""
    from peft_grounded.cli.common import DataArguments, SFTArguments
    from peft_grounded.cli.demo import DemoArguments
    from peft_grounded.cli.model_config import LoraModelConfig
    from peft_grounded.cli.recommend import RecommendArguments
    from peft_grounded.cli.sids import BuildSIDsArguments
    from peft_grounded.pipeline.budget import Budget
    from peft_grounded.pipeline.demo import Preset
    from peft_grounded.sids.behaviour import ItemVectorsConfig
    from peft_grounded.sids.extended_base import RowStart
    from peft_grounded.training.stage_config import GroundingConfig, RecommendationConfig

    return (
        SFTArguments,
        DataArguments,
        LoraModelConfig,  # GroundedModelConfig's and TRL's ModelConfig's fields
        BuildSIDsArguments,
        DemoArguments,
        RecommendArguments,
        RecommendationConfig,  # TRL's SFTConfig's and transformers' TrainingArguments' fields
        GroundingConfig,
        Budget,
        Preset,
        RowStart,
        ItemVectorsConfig,
    )


def declared_by() -> dict[str, list[str]]:
    """Field name -> the package's dataclasses that declare it."""
    found: dict[str, list[str]] = {}
    for settings in package_settings():
        for f in dataclasses.fields(settings):
            found.setdefault(f.name, []).append(settings.__name__)
    return found


def parsed_classes(name: str, monkeypatch) -> list[type]:
    """The dataclasses script ``name`` parses (what it hands :func:`benchmarks._args.parse`)."""
    script = importlib.import_module(f"benchmarks.{name}")
    seen: list[type] = []

    def spy(settings, *args, **kwargs):
        seen.extend(settings if isinstance(settings, tuple) else (settings,))
        return _args.parse(settings, *args, **kwargs)

    monkeypatch.setattr(script, "parse", spy)
    script.parse_args(ARGV.get(name, ["--out", "x"]))
    return seen


def test_the_recipes_name_only_listed_settings():
    """Every dataclass a recipe sets is one this test holds the scripts to."""
    from peft_grounded.recipes import RECIPES

    named = {part for recipe in RECIPES for part in recipe.parts()}
    listed = {c.__name__ for c in package_settings()}
    assert named <= listed, f"recipes set {sorted(named - listed)}: add them to package_settings()"


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_script_declares_no_setting_the_package_declares(name, monkeypatch):
    declared = declared_by()
    classes = parsed_classes(name, monkeypatch)
    own = [c for c in classes if not c.__module__.startswith("peft_grounded")]
    assert own, f"{name} parses no settings of its own"
    twice = {
        f"{c.__name__}.{f.name}": declared[f.name]
        for c in own
        for f in dataclasses.fields(c)
        if f.init and f.name in declared and f.name not in ALLOWED | ALLOWED_IN.get(name, set())
    }
    assert not twice, (
        f"{name} declares settings the package declares (parse the package's dataclass, or "
        f"benchmarks._args.package_fields of it, under its flag): {twice}"
    )


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_package_fields_a_script_parses_are_the_packages_declarations(name, monkeypatch):
    """A class of fields taken from the package (``package_fields``) copies each field's type, default and help:
    the script changes a default through ``parse(defaults=...)`` only, never by declaring the field again."""
    import typing

    listed = package_settings()
    for view in parsed_classes(name, monkeypatch):
        source = getattr(view, "__settings_of__", None)
        if source is None:
            continue
        assert any(issubclass(source, settings) for settings in listed), (
            f"{source.__name__} is not listed here"
        )
        theirs = {f.name: f for f in dataclasses.fields(source)}
        hints, copied = typing.get_type_hints(source), typing.get_type_hints(view)
        for f in dataclasses.fields(view):
            original = theirs[f.name]
            assert f.metadata["help"] == original.metadata["help"], f.name
            default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
            expected = (
                original.default
                if original.default_factory is dataclasses.MISSING
                else original.default_factory()
            )
            assert default == (list(expected) if isinstance(expected, tuple) else expected), f.name
            assert copied[f.name] == _args._listed(hints[f.name]), f.name  # a tuple's items as a list


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_every_allowed_name_is_still_needed(name, monkeypatch):
    """An allowed name no script declares any more leaves the list."""
    declared = declared_by()
    assert name in declared, f"{name} is no package field: drop it from ALLOWED"
    own = {
        f.name
        for script in SCRIPTS
        for c in parsed_classes(script, monkeypatch)
        if not c.__module__.startswith("peft_grounded")
        for f in dataclasses.fields(c)
    }
    assert name in own, f"no script declares {name}: drop it from ALLOWED"


def test_package_fields_copies_the_declaration():
    from peft_grounded.pipeline.budget import Budget
    from peft_grounded.pipeline.demo import Preset
    from peft_grounded.training.stage_config import RecommendationConfig

    view = _args.package_fields(RecommendationConfig, "learning_rate", "sid_softmax")
    assert view.__settings_of__ is RecommendationConfig and view.__module__ == RecommendationConfig.__module__
    rates = _args.parse(view, ["--learning-rate", "1e-3", "--sid-softmax"], prog="x", config_file=False)
    assert (rates.learning_rate, rates.sid_softmax) == (1e-3, True)
    assert _args.parse(view, [], prog="x", config_file=False) == view(learning_rate=5e-4, sid_softmax=None)
    parts = _args.package_fields(Budget, "eval_parts")  # tuple[str, ...] | None: parsed as a list
    assert _args.parse(parts, ["--eval-parts", "valid", "test"], prog="x").eval_parts == ["valid", "test"]
    peers = _args.package_fields(Preset, "peers", parser={"peers": {"action": _args.ZeroOrMore}})
    assert peers().peers == ["popularity", "knn_last", "sasrec"]
    assert _args.parse(peers, ["--peers"], prog="x").peers == []
    with pytest.raises(ValueError, match="declares no help"):  # a field the package explains nowhere
        _args.package_fields(Preset, "note")
    with pytest.raises(ValueError, match="no field"):
        _args.package_fields(Budget, "nonesuch")
    assert _args.field_default(RecommendationConfig, "learning_rate") == 5e-4
