"""One evaluation pass: rankings, likelihoods and per-user records agree with the separate computations."""

from __future__ import annotations

import pytest
import torch
from helpers.toy_catalogue import toy_catalogue, toy_index

from peft_grounded.adapter import add_tokens
from peft_grounded.decoding import SIDTrie, recommend
from peft_grounded.evaluation import (
    EvalSettings,
    evaluate,
    evaluate_popularity,
    item_token_ids,
    popularity_users,
    target_log_likelihood,
    target_rank,
)
from peft_grounded.prompts import PromptFormat, inference_prompts


def evaluate_plain(*args, **kwargs):
    """``evaluate`` of the plain tiny models here, which decode over the whole vocabulary."""
    return evaluate(*args, sid_softmax=False, **kwargs)


KS = (1, 3, 5)


@pytest.fixture
def setup(tokenizer, tiny_model_factory):
    catalogue = toy_catalogue(n_items=16, n_users=12)
    index = toy_index(catalogue)
    model = tiny_model_factory(arch="llama", tied=True)
    add_tokens(tokenizer, model, index.token_strings)
    with torch.no_grad():  # distinct random rows for the SID tokens: no ties in the rankings
        ids = tokenizer.convert_tokens_to_ids(index.token_strings)
        generator = torch.Generator().manual_seed(0)
        model.get_input_embeddings().weight[ids] = torch.randn(len(ids), 64, generator=generator)
    return model, tokenizer, catalogue, index, catalogue.leave_one_out()


def test_one_pass_equals_the_separate_computations(setup):
    model, tokenizer, catalogue, index, split = setup
    fmt = PromptFormat(max_history=4)
    settings = EvalSettings(
        ks=KS, users=8, num_beams=6, decode_batch_size=3, cold_max_count=1, exclude_history=False
    )
    args = (model, tokenizer, split, index, catalogue, fmt, ("valid", "test"), settings)
    ev = evaluate_plain(*args)
    assert ev.metrics == evaluate_plain(*args, likelihood=False).metrics
    separate = evaluate_plain(
        *args, ranking=False
    ).likelihood  # a full teacher-forced forward: equal up to float rounding
    for part, subsets in separate.items():
        for subset, values in subsets.items():
            assert ev.likelihood[part][subset] == pytest.approx(values, rel=1e-5)
    assert set(ev.metrics["test"]) == {"all", "cold", "decoding"}
    trie = SIDTrie(item_token_ids(tokenizer, index))
    sids = item_token_ids(tokenizer, index)
    for part in ("valid", "test"):
        records = ev.users[part]
        examples = {e[0]: e for e in getattr(split, f"{part}_examples")(fmt.max_history)}
        chosen = [examples[r["user"]] for r in records]
        _, prompts, targets = inference_prompts(chosen, index, tokenizer, catalogue, fmt)
        ranked = recommend(model, tokenizer, prompts, trie, k=max(KS), num_beams=6).items
        scores = target_log_likelihood(model, tokenizer, prompts, [sids[t] for t in targets], trie)
        for record, items, target, score in zip(records, ranked, targets, scores, strict=True):
            assert record["target"] == target
            assert record["rank"] == target_rank(items, target)
            assert record["constrained_nll"] == pytest.approx(score["constrained_nll"], abs=1e-4)
        in_all = [r for r in records if r["all"]]
        assert len(in_all) == ev.metrics[part]["all"]["users"] == 8
        hits = sum(r["rank"] is not None and r["rank"] < 3 for r in in_all) / len(in_all)
        assert ev.metrics[part]["all"]["recall@3"] == pytest.approx(hits)
    only_likelihood = evaluate_plain(*args, ranking=False)
    assert only_likelihood.metrics == {} and "rank" not in only_likelihood.users["test"][0]
    with pytest.raises(ValueError, match="nothing to evaluate"):
        evaluate_plain(*args, ranking=False, likelihood=False)


def test_popularity_users_match_its_aggregates(setup):
    _, _, _, index, split = setup
    settings = EvalSettings(ks=KS, users=8)
    users = popularity_users(split, settings=settings, items=index.item_ids)
    aggregate = evaluate_popularity(split, settings=settings, items=index.item_ids)
    in_all = [r for r in users["test"] if r["all"]]
    assert aggregate["test"]["all"]["recall@5"] == pytest.approx(
        sum(r["rank"] is not None and r["rank"] < 5 for r in in_all) / len(in_all)
    )
    nll = sum(r["constrained_nll"] for r in in_all) / len(in_all)
    assert aggregate["test"]["all"]["constrained_nll"] == pytest.approx(nll)
    assert len(in_all) == 8 and any(r["cold"] for r in users["test"])


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("decode_batch_size", 0, "decode_batch_size must be a positive integer"),
        ("num_beams", -1, "num_beams must be a positive integer"),
        ("users", 0, "users must be a positive integer or None"),
        ("ks", (0, 5), "ks must be positive integers"),
        ("ks", (), "ks must be positive integers"),
        ("cold_max_count", -1, "cold_max_count must be an integer >= 0"),
        ("decode_batch_size", 2.5, "decode_batch_size must be a positive integer"),
    ],
)
def test_eval_settings_refuse_nonsense(field, value, message):
    with pytest.raises(ValueError, match=message):
        EvalSettings(**{field: value})


def test_exclude_history_leaves_the_users_items_out_and_keeps_the_rest_in_order(setup):
    """With ``exclude_history`` each list is the beam list without the user's whole history (not only the
    prompt's tail), cut to max(ks): a target the user already had can no longer be hit."""
    model, tokenizer, catalogue, index, split = setup
    fmt = PromptFormat(max_history=2)
    settings = EvalSettings(ks=KS, users=8, num_beams=12, decode_batch_size=4, cold=False)
    kept = evaluate_plain(
        model, tokenizer, split, index, catalogue, fmt, ("test",), settings, likelihood=False
    )
    dropped = evaluate_plain(
        model,
        tokenizer,
        split,
        index,
        catalogue,
        fmt,
        ("test",),
        EvalSettings(**{**settings.__dict__, "exclude_history": True}),
        likelihood=False,
    )
    trie = SIDTrie(item_token_ids(tokenizer, index))
    examples = {e[0]: e for e in split.test_examples(fmt.max_history)}
    by_user = {u.user_id: u for u in split.users}
    records = dropped.users["test"]
    _, prompts, _ = inference_prompts(
        [examples[r["user"]] for r in records], index, tokenizer, catalogue, fmt
    )
    beams = recommend(model, tokenizer, prompts, trie, k=12, num_beams=12).items
    for record, items in zip(records, beams, strict=True):
        u = by_user[record["user"]]
        seen = {*u.history, u.valid}
        expected = [i for i in items if i not in seen][: max(KS)]
        assert record["rank"] == target_rank(expected, record["target"])
        if record["target"] in seen:
            assert record["rank"] is None
    assert len(kept.users["test"]) == len(records)
