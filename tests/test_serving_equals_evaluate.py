"""One decoding, whatever the loading: `evaluate`, `GroundedRecommender` (adapter merged or not, or a folder
written by `save_merged`) and `peft-grounded recommend` give the same lists for the same adapter and users,
for adapters trained with and without the SID-only softmax, on tied and untied heads."""

from __future__ import annotations

import json

import pytest
from conftest import build_tiny_model
from helpers.serving_fixtures import toy_adapter
from helpers.toy_catalogue import toy_catalogue

from peft_grounded.cli import main
from peft_grounded.evaluation import EvalSettings
from peft_grounded.evaluation.evaluator import evaluate_adapter
from peft_grounded.serving import GroundedRecommender

K, BEAMS = 5, 8
CASES = [("llama", True, True), ("llama", True, False), ("qwen3", False, True), ("qwen3", False, False)]


@pytest.fixture(
    scope="module", params=CASES, ids=lambda c: f"{c[0]}-{'tied' if c[1] else 'untied'}-sid{c[2]}"
)
def served(request, tmp_path_factory):
    arch, tied, sid_softmax = request.param
    root = tmp_path_factory.mktemp(f"equal-{arch}-{sid_softmax}")
    catalogue, index, adapter = toy_adapter(root, arch, tied, sid_softmax)
    settings = EvalSettings(ks=[K], num_beams=BEAMS, cold=False, exclude_history=True)
    evaluation = evaluate_adapter(str(adapter), index, catalogue, settings, parts=("test",), likelihood=False)
    split = catalogue.leave_one_out()
    users = [u.user_id for u in split.users]
    histories = [[*u.history, u.valid] for u in split.users]
    lists = {r["user"]: r["items"] for r in evaluation.users["test"]}
    scores = {r["user"]: r["scores"] for r in evaluation.users["test"]}
    return {"root": root, "adapter": adapter, "users": users, "histories": histories, "lists": lists,
            "scores": scores, "sid_softmax": sid_softmax, "ranks": {r["user"]: r["rank"] for r in evaluation.users["test"]}}  # fmt: skip


def _served_lists(recommender, served) -> dict[str, list[str]]:
    out = recommender.recommend(served["histories"], k=K, users=served["users"])
    return {r.user: r.items for r in out}


@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
def test_recommend_serves_the_lists_evaluate_measured(served, merge):
    recommender = GroundedRecommender.from_pretrained(served["adapter"], merge=merge, num_beams=BEAMS)
    assert (recommender.sid_rows is not False) == served["sid_softmax"]
    out = recommender.recommend(served["histories"], k=K, users=served["users"])
    assert {r.user: r.items for r in out} == served["lists"]
    assert all(len(r.items) == K for r in out)
    for r in out:  # the scores too: a step normalised otherwise scores otherwise
        assert r.scores == pytest.approx(served["scores"][r.user], abs=1e-4)


def test_a_saved_merged_folder_and_the_command_line_serve_them_too(served, tmp_path, capsys):
    recommender = GroundedRecommender.from_pretrained(served["adapter"], num_beams=BEAMS)
    folder = recommender.save_merged(tmp_path / "merged")
    record = json.loads((folder / "grounded_serving.json").read_text())
    assert (record["sid_token_ids"] is not None) == served["sid_softmax"]
    merged = GroundedRecommender.from_pretrained(folder, num_beams=BEAMS)
    assert _served_lists(merged, served) == served["lists"]

    users = tmp_path / "users.jsonl"
    users.write_text(
        "".join(
            json.dumps({"user": u, "history": h}) + "\n"
            for u, h in zip(served["users"], served["histories"], strict=True)
        )
    )
    argv = ["recommend", "--histories", str(users), "--k", str(K), "--num_beams", str(BEAMS)]
    for source in (served["adapter"], folder):
        out = tmp_path / f"out-{source.name}"
        assert main([*argv, "--adapter", str(source), "--output_dir", str(out)]) == 0
        lines = [json.loads(line) for line in (out / "recommendations.jsonl").read_text().splitlines()]
        assert {line["user"]: line["items"] for line in lines} == served["lists"]


def test_recall_of_the_served_lists_is_the_evaluated_recall(served):
    """What `evaluate` reports is what the served lists score on the same targets."""
    from peft_grounded.evaluation.metrics import target_rank

    split = {u.user_id: u.test for u in toy_catalogue().leave_one_out().users}
    recommender = GroundedRecommender.from_pretrained(served["adapter"], num_beams=BEAMS)
    lists = _served_lists(recommender, served)
    assert {u: target_rank(items, split[u]) for u, items in lists.items()} == served["ranks"]


def test_the_other_normalisation_scores_otherwise(served):
    """The checks above can fail: decoding a SID-softmax adapter over the whole vocabulary (what a merge
    silently did before) changes the scores (on the real SmolLM2, the lists too)."""
    recommender = GroundedRecommender.from_pretrained(
        served["adapter"], num_beams=BEAMS, sid_softmax=not served["sid_softmax"]
    )
    out = recommender.recommend(served["histories"], k=K, users=served["users"])
    right = GroundedRecommender.from_pretrained(served["adapter"], num_beams=BEAMS)
    scores = right.recommend(served["histories"], k=K, users=served["users"])
    assert [r.scores for r in out] != [r.scores for r in scores]


def test_evaluate_on_a_merged_model_needs_its_rows_and_then_measures_the_same_lists(served):
    """A merged (plain) model no longer says how it normalises each SID step: evaluate refuses to guess, and
    with the rows the recommender read before merging it measures the same lists as on the adapter."""
    from peft_grounded.evaluation.evaluator import evaluate

    recommender = GroundedRecommender.from_pretrained(served["adapter"], num_beams=BEAMS)  # merged
    catalogue = toy_catalogue()
    index = recommender.index
    settings = EvalSettings(ks=[K], num_beams=BEAMS, cold=False, exclude_history=True)
    split = catalogue.leave_one_out()
    args = (
        recommender.model,
        recommender.tokenizer,
        split,
        index,
        catalogue,
        recommender.fmt,
        ("test",),
        settings,
    )
    with pytest.raises(ValueError, match="sid_softmax=True"):
        evaluate(*args, likelihood=False)
    measured = evaluate(*args, likelihood=False, sid_softmax=recommender.sid_rows)
    assert {r["user"]: r["items"] for r in measured.users["test"]} == served["lists"]


# --------------------------------------------------------------- one route: a plain and a grown adapter

LOGGED = {  # interactions logged since training (the newest item last), some of them to the new items
    "a": ["0", "4", "new0"],
    "b": ["1", "new0", "new1"],
    "c": ["2", "6"],
    "d": ["3", "new2"],
    "e": ["8", "9", "10"],
}


def _grown_catalogue(catalogue):
    """The toy catalogue with the child index's three new items: some users' validation targets are new
    items (their test histories hold one), others' test targets are."""
    from peft_grounded.sids import Catalogue, Item

    items = dict(catalogue.items) | {f"new{i}": Item(f"new{i}", title=f"New {i}") for i in range(3)}
    sequences = {}
    for n, (user, seq) in enumerate(catalogue.sequences.items()):
        new = f"new{n % 3}"
        sequences[user] = (*seq[:-1], new, seq[-1]) if n < 6 else (*seq, new) if n < 9 else seq
    return Catalogue("toy-grown", items, sequences)


@pytest.fixture(scope="module")
def route_world(tmp_path_factory, smollm2_dir):
    """The serving world (an adapter on the parent index; the same adapter grown onto a child index with
    three new items), the new-item rule fitted on logged interactions and stored with the grown adapter,
    and a catalogue for each."""
    from helpers.serving_fixtures import serving_world
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("route")
    world = serving_world(root, AutoTokenizer.from_pretrained(smollm2_dir), build_tiny_model)
    with pytest.warns(UserWarning, match="holds no new-item rule"):
        unruled = GroundedRecommender.from_pretrained(root / "grown", num_beams=BEAMS)
    unruled.fit_new_items(LOGGED.values(), choose_beams=False).save(root / "grown")
    plain = toy_catalogue()
    return world | {"catalogues": {"adapter": plain, "grown": _grown_catalogue(plain)}}


def _histories(split, part):
    return {u.user_id: list(u.history) if part == "valid" else [*u.history, u.valid] for u in split.users}


@pytest.mark.parametrize("exclude_history", [True, False], ids=["history-left-out", "history-kept"])
@pytest.mark.parametrize("which", ["adapter", "grown"])
def test_evaluate_and_recommend_give_the_same_lists(route_world, which, exclude_history):
    """The done-when of issue 41, item 3: for the same users and adapter, `evaluate` measures the lists
    `recommend` serves, a grown adapter's stored new-item rule included (evaluate once served another rule,
    the slot rule of --new_item_share, and filtered the history its own way)."""
    import warnings

    folder = route_world["root"] / which
    index = route_world["parent" if which == "adapter" else "child"]
    catalogue = route_world["catalogues"][which]
    settings = EvalSettings(ks=[K], num_beams=BEAMS, cold=False, exclude_history=exclude_history)
    evaluation = evaluate_adapter(str(folder), index, catalogue, settings, likelihood=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        recommender = GroundedRecommender.from_pretrained(folder, merge=False, num_beams=BEAMS)
    assert not [w for w in caught if "new-item rule" in str(w.message)]  # the grown adapter carries its rule
    assert (recommender.new_item_rule is not None) == (which == "grown")
    split = catalogue.leave_one_out()
    served_new = 0
    for part in ("valid", "test"):
        records = evaluation.users[part]
        histories = _histories(split, part)
        users = [r["user"] for r in records]
        out = recommender.recommend(
            [histories[u] for u in users], k=K, exclude_history=exclude_history, users=users
        )
        assert [r.items for r in out] == [r["items"] for r in records]
        for r, record in zip(out, records, strict=True):
            assert r.scores == pytest.approx(record["scores"], abs=1e-5)
        served_new += sum(r.new_items for r in out)
        if which == "grown" or exclude_history:  # the rule always leaves the history out
            assert all(not set(r.items) & set(histories[r.user]) for r in out)
    assert (served_new > 0) == (which == "grown")  # the rule did serve new items


def test_evaluate_of_a_grown_adapter_serves_its_stored_rule(route_world):
    """The rule stored with the grown adapter changes the measured lists (the test above is not vacuous):
    without it, `evaluate` measures the model alone, which ranks no new item first."""
    from peft_grounded.evaluation.evaluator import evaluate

    folder = route_world["root"] / "grown"
    catalogue = route_world["catalogues"]["grown"]
    settings = EvalSettings(ks=[K], num_beams=BEAMS, cold=False, exclude_history=True)
    ruled = evaluate_adapter(str(folder), route_world["child"], catalogue, settings, likelihood=False)
    recommender = GroundedRecommender.from_pretrained(folder, merge=False, num_beams=BEAMS)
    args = (recommender.model, recommender.tokenizer, catalogue.leave_one_out(), recommender.index, catalogue)
    alone = evaluate(*args, recommender.fmt, ("valid", "test"), settings, likelihood=False)
    again = evaluate(
        *args, recommender.fmt, ("valid", "test"), settings, likelihood=False,
        new_item_rule=recommender.new_item_rule,
    )  # fmt: skip
    lists = {name: [r["items"] for part in ("valid", "test") for r in e.users[part]]
             for name, e in (("ruled", ruled), ("alone", alone), ("again", again))}  # fmt: skip
    assert lists["ruled"] == lists["again"] != lists["alone"]
    new = set(route_world["child"].added_items())
    assert sum(i in new for row in lists["ruled"] for i in row) > sum(
        i in new for row in lists["alone"] for i in row
    )


def test_the_command_line_serves_the_grown_adapters_evaluated_lists(route_world, tmp_path):
    folder = route_world["root"] / "grown"
    catalogue = route_world["catalogues"]["grown"]
    settings = EvalSettings(ks=[K], num_beams=BEAMS, cold=False, exclude_history=True)
    evaluation = evaluate_adapter(
        str(folder), route_world["child"], catalogue, settings, parts=("test",), likelihood=False
    )
    histories = _histories(catalogue.leave_one_out(), "test")
    users = tmp_path / "users.jsonl"
    users.write_text("".join(json.dumps({"user": r["user"], "history": histories[r["user"]]}) + "\n"
                             for r in evaluation.users["test"]))  # fmt: skip
    argv = ["recommend", "--adapter", str(folder), "--histories", str(users), "--k", str(K)]
    assert main([*argv, "--num_beams", str(BEAMS), "--output_dir", str(tmp_path / "out")]) == 0
    lines = [
        json.loads(line) for line in (tmp_path / "out" / "recommendations.jsonl").read_text().splitlines()
    ]
    assert {line["user"]: line["items"] for line in lines} == {
        r["user"]: r["items"] for r in evaluation.users["test"]
    }


def test_a_rule_weighing_the_models_new_item_search_is_served_as_evaluated(route_world, tmp_path):
    """A rule with ``model_weight`` > 0 decodes a second search, over the new items alone: `evaluate` and
    `recommend` run it the same way, and it moves the new items served."""
    import shutil

    from peft_grounded.new_items import NewItemRule

    folder = tmp_path / "grown"
    shutil.copytree(route_world["root"] / "grown", folder)
    rule = NewItemRule.load(folder)
    rule.mode, rule.min_places, rule.model_weight = "share", 2, 10.0
    rule.mixture.temperature = 1.0  # the text's logits within a few units: the model's weight shows
    rule.save(folder)
    catalogue = route_world["catalogues"]["grown"]
    settings = EvalSettings(ks=[K], num_beams=BEAMS, cold=False, exclude_history=True)
    evaluation = evaluate_adapter(str(folder), route_world["child"], catalogue, settings, likelihood=False)
    recommender = GroundedRecommender.from_pretrained(folder, merge=False, num_beams=BEAMS)
    assert recommender.new_item_rule.model_weight == 10.0
    split = catalogue.leave_one_out()
    new = set(route_world["child"].added_items())
    weighed = []
    for part in ("valid", "test"):
        records = evaluation.users[part]
        histories = _histories(split, part)
        out = recommender.recommend(
            [histories[r["user"]] for r in records], k=K, users=[r["user"] for r in records]
        )
        assert [r.items for r in out] == [r["items"] for r in records]
        weighed += [[i for i in r.items if i in new] for r in out]
    rule.model_weight = 0.0
    rule.save(folder)
    plain = evaluate_adapter(str(folder), route_world["child"], catalogue, settings, likelihood=False)
    text_only = [[i for i in r["items"] if i in new] for part in ("valid", "test") for r in plain.users[part]]
    assert weighed != text_only  # the model's search reordered the new items served
