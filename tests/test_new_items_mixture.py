"""The semantic mixture serves new items by calibrated probability: the planted neighbour of a user's
profile comes first when that user is likely to pick a new item, and the model's list stays when not."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from peft_grounded.decoding import Recommendations
from peft_grounded.new_items import SemanticMixture


def catalogue():
    """Old items o0..o3 and new items n0..n3; n_j sits next to o_j in text space."""
    rng = np.random.default_rng(0)
    base = rng.normal(size=(4, 16))
    old = base + 0.05 * rng.normal(size=(4, 16))
    new = base + 0.05 * rng.normal(size=(4, 16))
    ids = [f"o{j}" for j in range(4)] + [f"n{j}" for j in range(4)]
    return ids, np.vstack([old, new]).astype(np.float32), [f"n{j}" for j in range(4)]


def calibration():
    """Users whose last item is new go to a new item (its neighbour); the others stay with old items."""
    pairs = []
    for rep in range(10):
        for j in range(4):
            pairs.append(([f"o{(j + 1) % 4}", f"n{j}"], f"n{(j + rep % 2) % 4}" if rep % 2 == 0 else f"n{j}"))
            pairs.append(([f"o{(j + 2) % 4}", f"o{j}"], f"o{(j + 1) % 4}"))
    return [(h, t if t not in h else f"n{(int(t[1]) + 1) % 4}") for h, t in pairs]


def test_calibration_learns_who_goes_to_new_items():
    ids, vectors, new = catalogue()
    mixture = SemanticMixture.fit(ids, vectors, new, calibration())
    prior = mixture.new_item_prior([["o1", "n2"], ["o3", "o2"]])
    assert prior[0] > 0.9 and prior[1] < 0.1
    assert 0.005 <= mixture.temperature <= 1.0


def test_a_likely_new_item_user_gets_the_planted_neighbour_first():
    ids, vectors, new = catalogue()
    mixture = SemanticMixture.fit(ids, vectors, new, calibration())
    histories = [["o1", "o2"], ["o2", "n1"]]  # the second user: last item new
    recs = Recommendations(
        items=[["o3", "o0", "o1"], ["o3", "o0", "o2"]], scores=[[-1.0, -2.0, -3.0]] * 2, k=3, num_beams=3
    )
    mixed = mixture.mix(recs, histories, k=3)
    # the likely new-item user: the new item nearest its profile (n1 is in the history, so n2, o2's twin)
    assert mixed.items[1][0] == "n2"
    assert "n1" not in mixed.items[1] and "o2" not in mixed.items[1]  # never an item of the history
    assert mixed.items[0][:2] == ["o3", "o0"]  # an old-item user keeps the model's picks first
    assert "o1" not in mixed.items[0]
    assert mixed.extra["new_items_per_list"][1] >= 1
    assert all(a >= b for a, b in zip(mixed.scores[1], mixed.scores[1][1:], strict=False))


def test_text_probabilities_are_a_softmax_over_new_items_without_the_history():
    ids, vectors, new = catalogue()
    mixture = SemanticMixture(ids, vectors, new, temperature=0.1)
    p = mixture.text_probabilities([["o2"], ["n0", "o0"]])
    assert p.shape == (2, 4) and np.allclose(p.sum(axis=1), 1.0)
    assert p[0].argmax() == 2  # n2 is o2's neighbour
    assert p[1, 0] == 0.0  # n0 is in the history


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(new_items=[]), "no new items"),
        (dict(new_items=["missing"]), "no vector"),
        (dict(vectors=np.zeros((8, 16))), "non-zero"),
        (dict(temperature=0.0), "temperature"),
    ],
)
def test_bad_input_is_refused(kwargs, match):
    ids, vectors, new = catalogue()
    args = dict(item_ids=ids, vectors=vectors, new_items=new) | kwargs
    with pytest.raises(ValueError, match=match):
        SemanticMixture(**args)


def test_mixture_probability_adds_both_experts_for_a_new_item_the_model_also_ranked():
    ids, vectors, new = catalogue()
    mixture = SemanticMixture(ids, vectors, new, temperature=0.1)
    mixture.weights = np.array([0.0, 0.0, 0.0])  # pi = 1/2 for everyone
    histories = [["o2"]]
    recs = Recommendations(items=[["n2", "o1"]], scores=[[math.log(0.5), math.log(0.4)]], k=2, num_beams=2)
    mixed = mixture.mix(recs, histories, k=2)
    p_text = mixture.text_probabilities(histories)[0][new.index("n2")]
    assert mixed.items[0][0] == "n2"
    assert math.exp(mixed.scores[0][0]) == pytest.approx(0.5 * 0.5 + 0.5 * p_text)


def test_share_mode_keeps_the_models_first_places_for_unlikely_users():
    ids, vectors, new = catalogue()
    mixture = SemanticMixture.fit(ids, vectors, new, calibration())
    histories = [["o1", "o2"], ["o2", "n1"]]
    pi = mixture.new_item_prior(histories)
    tiny = [[-30.0, -31.0, -32.0, -33.0]] * 2  # a weak model: the probability mode would serve new items
    recs = Recommendations(
        items=[["o3", "o0", "o1", "o2"], ["o3", "o0", "o1", "o2"]], scores=tiny, k=4, num_beams=4
    )
    by_probability = mixture.mix(recs, histories, k=4)
    assert by_probability.items[0][0] in new
    shared = mixture.mix(recs, histories, k=4, mode="share")
    quota = [round(4 * p) for p in pi]
    assert quota[0] == 0 and quota[1] >= 3
    assert shared.items[0][:2] == ["o3", "o0"]  # the unlikely user keeps the model's list (history left out)
    assert shared.items[1][: 4 - quota[1]] == ["o3", "o0", "o1"][: 4 - quota[1]]
    assert all(i in new for i in shared.items[1][4 - quota[1] :]) and "n1" not in shared.items[1]
    with pytest.raises(ValueError, match="mode"):
        mixture.mix(recs, histories, mode="slots")


def test_text_beams_rank_every_listable_item_by_the_profile_without_the_history():
    ids, vectors, new = catalogue()
    mixture = SemanticMixture(ids, vectors, new, temperature=0.1)
    beams = mixture.text_beams([["o0"], ["o1", "n1"]], 4)
    assert beams.items[0][0] == "n0" and "o0" not in beams.items[0]  # o0's text neighbour; o0 itself left out
    assert not {"o1", "n1"} & set(beams.items[1])
    for scores in beams.scores:
        assert scores == sorted(scores, reverse=True) and sum(math.exp(s) for s in scores) <= 1 + 1e-6
    only = mixture.text_beams([["o0"]], 4, allowed={"o2", "o3", "o0"})
    assert set(only.items[0]) == {"o2", "o3"}  # what may be listed, less the history
    assert math.isclose(sum(math.exp(s) for s in only.scores[0]), 1.0, rel_tol=1e-5)


def test_the_rule_serves_text_only_where_it_beats_the_model_on_the_log():
    from peft_grounded.serving import NewItemRule, NewItemRuleError

    ids, vectors, new = catalogue()
    pairs = [([f"n{j}"], f"o{j}") for j in range(4)] * 10  # the logged next item: the new item's text twin
    histories, targets = [h for h, _ in pairs], [t for _, t in pairs]
    mixture = SemanticMixture.fit(ids, vectors, new, pairs, temperature=0.1)
    rule = NewItemRule(mixture, "fingerprint")
    others = [[f"o{(j + r) % 4}" for r in (1, 2, 3)] for j in range(4)] * 10

    def lists(items):
        scores = [[-float(r) for r in range(len(i))] for i in items]
        return Recommendations(items=items, scores=scores, k=4, num_beams=4)

    # a model whose beams never hold the logged next items: text wins, with an interval above 0
    wrong = lists(others)
    choice = rule.choose_beams(wrong, histories, targets, k=1)
    assert rule.beams == "text" and choice["choice_text_minus_model_ci95"][0] > 0
    assert rule.fitted_on["beams"] == "text" and choice["choice_pairs"] == 40
    # a model whose first beam is the logged next item: the model stays
    right = lists([[t, *o] for t, o in zip(targets, others, strict=True)])
    rule.choose_beams(right, histories, targets, k=1)
    assert rule.beams == "model"
    # a tie (both right) keeps the model: text must win, not draw
    assert rule.choose_beams(right, histories, targets, k=4)["beams"] == "model"
    with pytest.raises(NewItemRuleError, match="one logged next item and one model list per history"):
        rule.choose_beams(right, histories[:3], targets, k=1)
    with pytest.raises(NewItemRuleError, match="beams='other'"):
        NewItemRule(mixture, "fingerprint", beams="other")


def test_reserved_places_go_to_the_new_items_whatever_pi(tmp_path):
    """``min_places``: the unlikely user (pi_u ~ 0, no share place) still gets one new item, at the last
    place, the model's first places untouched; the likely user's share is not cut to it."""
    from peft_grounded.serving import NewItemRule, NewItemRuleError

    ids, vectors, new = catalogue()
    mixture = SemanticMixture.fit(ids, vectors, new, calibration())
    histories = [["o1", "o2"], ["o2", "n1"]]
    recs = Recommendations(
        items=[["o3", "o0", "o1", "o2"]] * 2, scores=[[-1.0, -2.0, -3.0, -4.0]] * 2, k=4, num_beams=4
    )
    plain = mixture.mix(recs, histories, k=2, mode="share")  # o1, o2 are history: two model items left
    reserved = mixture.mix(recs, histories, k=2, mode="share", min_places=1)
    assert plain.extra["new_items_per_list"][0] == 0 and not set(plain.items[0]) & set(new)
    assert reserved.items[0][:-1] == plain.items[0][:-1] and reserved.items[0][-1] in new
    assert round(2 * mixture.new_item_prior(histories)[1]) >= 1  # pi_u gives the likely user a place anyway
    assert reserved.items[1] == plain.items[1]
    with pytest.raises(ValueError, match="min_places"):
        mixture.mix(recs, histories, k=4, mode="probability", min_places=1)
    # the stored rule keeps the setting; a file without the field is refused, naming it
    rule = NewItemRule(mixture, "fingerprint", min_places=1)
    assert rule.apply(recs, histories, 2).items[0][-1] in new and "at least 1 places" in rule.describe()
    rule.save(tmp_path)
    assert NewItemRule.load(tmp_path).min_places == 1
    path = tmp_path / "new_item_rule.json"
    record = json.loads(path.read_text())
    record.pop("min_places")
    path.write_text(json.dumps(record))
    with pytest.raises(NewItemRuleError, match=r"missing fields \['min_places'\]"):
        NewItemRule.load(tmp_path)
    for bad, said in (
        (dict(min_places=-1), "integer >= 0"),
        (dict(min_places=1, mode="probability"), "share"),
    ):
        with pytest.raises(NewItemRuleError, match=said):
            NewItemRule(mixture, "fingerprint", **bad)


def _new_item_lists(items, scores):
    return Recommendations(items=items, scores=scores, k=len(items[0]), num_beams=len(items[0]))


def test_the_model_weight_multiplies_p_text_by_the_models_probability_of_each_new_item():
    ids, vectors, new = catalogue()
    mixture = SemanticMixture.fit(ids, vectors, new, calibration())
    mixture.temperature = 1.0  # the text's logits within a few units: the model can outweigh them
    histories = [["o1", "o2"], ["o2", "n1"]]
    beams = _new_item_lists([["n3", "n0"], ["n0", "n2"]], [[-0.5, -3.0], [-1.0, -2.0]])
    text = mixture.text_probabilities(histories)
    assert np.array_equal(mixture.text_probabilities(histories, beams, 0.0), text)  # 0: the text alone
    model = mixture.model_log_probs(beams)
    # each list's scores, and its lowest for the new items outside it
    assert model[0].tolist() == [-3.0, -3.0, -3.0, -0.5] and model[1].tolist() == [-1.0, -2.0, -2.0, -2.0]
    both = mixture.text_probabilities(histories, beams, 0.7)
    with np.errstate(divide="ignore"):
        by_hand = np.log(text) + 0.7 * model
    by_hand = np.exp(by_hand - by_hand.max(axis=1, keepdims=True))
    by_hand /= by_hand.sum(axis=1, keepdims=True)
    assert np.allclose(both, by_hand) and both[1, 1] == 0.0  # n1 is in the second history: never listed
    # served: the share mode's new places follow the product
    recs = Recommendations(items=[["o3", "o0"]] * 2, scores=[[-1.0, -2.0]] * 2, k=2, num_beams=2)
    plain = mixture.mix(recs, histories, k=4, mode="share", min_places=1)
    weighed = mixture.mix(
        recs, histories, k=4, mode="share", min_places=1, new_item_beams=beams, model_weight=50.0
    )
    first_new = [next(i for i in row if i in new) for row in (*plain.items, *weighed.items)]
    assert first_new == ["n2", "n2", "n3", "n0"]  # o2's text twin for both, then the model's first beams
    # a new item the model's own list holds high does not take the new place the product gives another
    strong = Recommendations(items=[["n0", "o3", "o0"]], scores=[[-0.01, -1.0, -2.0]], k=3, num_beams=3)
    alone = mixture.mix(strong, histories[:1], k=3, mode="share", min_places=1)
    led = mixture.mix(
        strong, histories[:1], k=3, mode="share", min_places=1, new_item_beams=replace(beams, items=beams.items[:1],
        scores=beams.scores[:1]), model_weight=50.0,
    )  # fmt: skip
    assert [i for i in alone.items[0] if i in new] == ["n0"] and [i for i in led.items[0] if i in new] == [
        "n3"
    ]
    with pytest.raises(ValueError, match="one list of new-item beams per history"):
        mixture.text_probabilities(histories, None, 0.5)


def test_the_model_weight_is_fitted_by_the_likelihood_of_held_out_new_next_items(tmp_path):
    from peft_grounded.serving import NewItemRule, NewItemRuleError

    ids, vectors, new = catalogue()
    mixture = SemanticMixture.fit(ids, vectors, new, calibration())
    mixture.temperature = 1.0  # the text's logits within a few units: the model can outweigh them
    histories = [[f"o{j}"] for j in range(4)] * 5
    targets = [f"n{(j + 2) % 4}" for j in range(4)] * 5  # not the text's twin: the text alone misses them
    knows = _new_item_lists([[t, f"n{(int(t[1]) + 1) % 4}"] for t in targets], [[-0.1, -4.0]] * 20)
    blind = _new_item_lists([[f"n{(int(t[1]) + 1) % 4}", t] for t in targets], [[-0.1, -4.0]] * 20)
    weight, table = mixture.fit_model_weight(histories, targets, knows)
    assert weight > 0 and table[0]["weight"] == 0.0
    assert max(table, key=lambda r: r["log_likelihood"])["weight"] == weight
    assert table[-1]["log_likelihood"] > table[0]["log_likelihood"]
    assert mixture.fit_model_weight(histories, targets, blind)[0] == 0.0  # a model that misleads: text alone
    with pytest.raises(ValueError, match="none of the held-out pairs goes to a new item"):
        mixture.fit_model_weight(histories, ["o1"] * 20, knows)
    # the rule: chosen on the log, served, saved, and a rule saved before the setting loads with 0
    rule = NewItemRule(mixture, "fingerprint")
    choice = rule.choose_model_weight(knows, histories, targets)
    assert rule.model_weight == weight == choice["model_weight"] and rule.fitted_on["model_weight"] == weight
    assert f"p_model^{weight:g}" in rule.describe()
    recs = Recommendations(
        items=[["o1", "o2", "o3"]] * 20, scores=[[-1.0, -2.0, -3.0]] * 20, k=3, num_beams=3
    )
    served = rule.apply(recs, histories, 3, knows)
    assert served.items == mixture.mix(recs, histories, 3, mode="share", new_item_beams=knows,
                                       model_weight=weight).items  # fmt: skip
    with pytest.raises(NewItemRuleError, match="give the model's search over the new items"):
        rule.apply(recs, histories, 3)
    rule.save(tmp_path)
    assert NewItemRule.load(tmp_path).model_weight == weight
    path = tmp_path / "new_item_rule.json"
    record = json.loads(path.read_text())
    record.pop("model_weight")
    path.write_text(json.dumps(record))
    with pytest.raises(NewItemRuleError, match=r"missing fields \['model_weight'\]"):
        NewItemRule.load(tmp_path)
    record["model_weight"] = -1
    path.write_text(json.dumps(record))
    with pytest.raises(NewItemRuleError, match="model_weight"):
        NewItemRule.load(tmp_path)
    for bad, said in (
        (dict(model_weight=-0.5), "a number between 0 and 10"),
        (dict(model_weight=1e308), "a number between 0 and 10"),  # new items would drop out of every list
        (dict(model_weight=1.0, beams="text"), "set model_weight=0"),
    ):
        with pytest.raises(NewItemRuleError, match=said):
            NewItemRule(mixture, "fingerprint", **bad)
    text_rule = NewItemRule(mixture, "fingerprint", beams="text")
    assert text_rule.choose_model_weight(knows, histories, targets)["model_weight"] == 0.0  # text beams: none
