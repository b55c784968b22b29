"""GroundedRecommender and `peft-grounded recommend` on tiny models: from a folder, the loopback Hub and a
merged folder, in-process and in a fresh process; new items by the stored rule; bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import build_tiny_model
from helpers.serving_fixtures import serving_world, write_histories

from peft_grounded.cli import main
from peft_grounded.serving import GroundedRecommender, HistoryInputError, NewItemRule

HISTORIES = {"u1": ["0", "1", "2"], "u2": ["3", "7"], "u3": ["5"]}
LOGGED = {  # interactions logged since training: the newest item last, some of them new items
    "a": ["0", "4", "new0"],
    "b": ["1", "new0", "new1"],
    "c": ["2", "6"],
    "d": ["3", "new2"],
    "e": ["8", "9", "10"],
}


@pytest.fixture(scope="module")
def world(tmp_path_factory, smollm2_dir):
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("serving")
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    return serving_world(root, tokenizer, build_tiny_model)


@pytest.fixture(scope="module")
def recommender(world):
    return GroundedRecommender.from_pretrained(world["root"] / "adapter", num_beams=8, batch_size=2)


def test_recommend_from_a_folder_matches_the_decoder_on_the_peft_model(world, recommender):
    from peft_grounded.decoding import recommend
    from peft_grounded.prompts import inference_prompts
    from peft_grounded.sids.extended_base import prompt_format_of, sid_model

    out = recommender.recommend(list(HISTORIES.values()), k=5, users=list(HISTORIES))
    assert [r.user for r in out] == list(HISTORIES)
    for result, history in zip(out, HISTORIES.values(), strict=True):
        assert len(result.items) == 5 and len(set(result.items)) == 5
        assert not set(result.items) & set(history)  # history left out
        assert result.scores == sorted(result.scores, reverse=True)
        assert result.titles == [None] * 5 and result.new_items == 0
    # the same lists as the package's decoder on the unmerged PEFT model, history filtered afterwards
    tokenizer, model = sid_model(
        world["base"], world["parent"], adapter=str(world["root"] / "adapter"), is_trainable=False
    )
    examples = [(u, h, None) for u, h in HISTORIES.items()]
    _, prompts, _ = inference_prompts(examples, world["parent"], tokenizer, None, prompt_format_of(model))
    recs = recommend(model, tokenizer, prompts, _trie(tokenizer, world), k=8, num_beams=8, batch_size=2)
    unmerged = GroundedRecommender.from_pretrained(
        world["root"] / "adapter", num_beams=8, merge=False, dtype="float32"
    )
    exact = unmerged.recommend(list(HISTORIES.values()), k=5)
    for result, items, scores, history in zip(
        exact, recs.items, recs.scores, HISTORIES.values(), strict=True
    ):
        assert result.items == [i for i in items if i not in history][:5]
        wanted = [s for i, s in zip(items, scores, strict=True) if i not in history][:5]
        assert result.scores == pytest.approx(wanted, abs=1e-5)
    merged32 = GroundedRecommender.from_pretrained(world["root"] / "adapter", num_beams=8, dtype="float32")
    in_float32 = merged32.recommend(list(HISTORIES.values()), k=5)
    for merged, plain in zip(in_float32, exact, strict=True):  # merging changes the scores by rounding only
        common = set(merged.items) & set(plain.items)
        assert len(common) >= 4
        for item in common:
            assert merged.scores[merged.items.index(item)] == pytest.approx(
                plain.scores[plain.items.index(item)], abs=1e-3
            )


def test_a_recommender_reads_each_of_its_files_once(world):
    """Loading reads each file of the adapter's folder once (``adapter_config.json`` was read nine times before
    issue 41, ``sid_record.json`` twice): what the checks read is what PEFT and the model get. Counted in a
    fresh process by an audit hook on ``open``."""
    folder = str(world["root"] / "grown")
    code = (
        "import collections, json, sys\n"
        "opened = []\n"
        "sys.addaudithook(lambda event, args: opened.append(str(args[0])) if event == 'open' else None)\n"
        "from peft_grounded import GroundedRecommender\n"
        "for merge in (True, False):\n"
        "    opened.clear()\n"
        f"    GroundedRecommender.from_pretrained({folder!r}, merge=merge)\n"
        f"    print(json.dumps(collections.Counter(p for p in opened if p.startswith({folder!r}))))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for line in proc.stdout.splitlines():
        counts = {Path(path).relative_to(folder).as_posix(): n for path, n in json.loads(line).items()}
        assert {"adapter_config.json", "sid_record.json"} <= set(counts), counts
        assert all(n == 1 for n in counts.values()), counts


def _trie(tokenizer, world):
    from peft_grounded.decoding import SIDTrie
    from peft_grounded.decoding.trie import item_token_ids

    return SIDTrie(item_token_ids(tokenizer, world["parent"]))


def test_include_history_candidates_titles_and_batches(world, recommender):
    from helpers.toy_catalogue import toy_catalogue

    history = ["0", "1", "2"]
    kept = recommender.recommend([history], k=5, exclude_history=False)[0]
    alone = recommender.recommend([history] * 3, k=5)  # batched with itself: the same list each time
    assert alone[0].items == alone[1].items == alone[2].items
    assert [i for i in kept.items if i not in history] == alone[0].items[
        : len([i for i in kept.items if i not in history])
    ]
    only = recommender.recommend([history, ["3"]], k=2, candidates=["4", "5", "6", "0"])
    assert set(only[0].items) <= {"4", "5", "6"} and set(only[1].items) <= {"0", "4", "5", "6"}
    per_user = recommender.recommend([history, ["3"]], k=1, candidates=[["4", "5"], ["6", "7"]])
    assert per_user[0].items[0] in {"4", "5"} and per_user[1].items[0] in {"6", "7"}
    titled = GroundedRecommender(
        recommender.model,
        recommender.tokenizer,
        recommender.index,
        recommender.fmt,
        catalogue=toy_catalogue(),
        sid_softmax=recommender.sid_rows,  # a merged model says how it normalises
    ).recommend([history], k=3)[0]
    assert titled.titles[0] == toy_catalogue().items[titled.items[0]].title
    assert "rank" in titled.table() and titled.items[0] in titled.table()


def test_bad_histories_are_named(recommender):
    with pytest.raises(HistoryInputError, match=r"user #0: items \['nope', 'zzz'\] are not in the SID index"):
        recommender.recommend([["0", "nope", "zzz"]], k=3)
    skipped = recommender.recommend([["0", "nope"]], k=3, skip_unknown=True)[0]
    assert skipped.skipped == ["nope"] and len(skipped.items) == 3
    assert skipped.items == recommender.recommend([["0"]], k=3)[0].items
    with pytest.raises(HistoryInputError, match="user u9 has an empty history"):
        recommender.recommend([["0"], []], k=3, users=["u1", "u9"])
    with pytest.raises(HistoryInputError, match="none of the 2 history items is in the SID index"):
        recommender.recommend([["nope", "zzz"]], k=3, skip_unknown=True)
    with pytest.raises(HistoryInputError, match="one list of item ids per user"):
        recommender.recommend(["0", "1"], k=3)
    n = recommender.index.n_items
    with pytest.raises(ValueError, match=f"k={n + 1} exceeds the catalogue's {n} items"):
        recommender.recommend([["0"]], k=n + 1)
    with pytest.raises(ValueError, match="k=3 exceeds the candidate set's 2 items"):
        recommender.recommend([["0"]], k=3, candidates=["4", "5"])
    with pytest.raises(ValueError, match="not in the SID index"):
        recommender.recommend([["0"]], k=1, candidates=["4", "nope"])


def test_a_user_whose_history_fills_the_beams_still_gets_k_items(recommender):
    n = recommender.index.n_items
    history = [str(i) for i in range(n - 4)]
    (result,) = recommender.recommend([history], k=4)
    assert sorted(result.items) == sorted(str(i) for i in range(n - 4, n))


def test_adapter_and_index_that_do_not_match_are_refused(world):
    with pytest.raises(
        ValueError, match="grow-adapter"
    ):  # the adapter trained on the parent, the child index
        GroundedRecommender.from_pretrained(world["root"] / "adapter", sid_index=world["root"] / "sids-v2")
    with pytest.raises(ValueError, match="tokens that are not this SID index"):
        GroundedRecommender.from_pretrained(world["root"] / "grown", sid_index=world["root"] / "sids")


def test_new_items_served_by_the_stored_rule(world, tmp_path):
    import shutil

    grown = tmp_path / "grown"
    shutil.copytree(world["root"] / "grown", grown)
    with pytest.warns(UserWarning, match="holds no new-item rule"):
        plain = GroundedRecommender.from_pretrained(grown, num_beams=8)
    rule = plain.fit_new_items(LOGGED.values())
    assert rule.mode == "share" and {"pairs": 5, "pairs_with_new_item": 3}.items() <= rule.fitted_on.items()
    # whose beams it mixes, chosen on the 5 logged pairs: text must win with an interval above 0, and 5 pairs
    # cannot show that, so the model's beams stay
    assert rule.beams == "model" and rule.fitted_on["choice_pairs"] == 5
    assert rule.fitted_on["choice_text_minus_model_ci95"][0] <= 0
    assert rule.new_items == world["child"].added_items()
    rule.save(grown)
    loaded = NewItemRule.load(grown)
    assert loaded.mode == "share" and loaded.mixture.temperature == rule.mixture.temperature
    served = GroundedRecommender.from_pretrained(grown, num_beams=8)  # no warning: the rule is stored
    users = [["0", "new0"], ["new1", "new2"], ["3", "4"]]
    out = served.recommend(users, k=5)
    assert any(r.new_items for r in out)  # users drawn to new items get some
    for r, history in zip(out, users, strict=True):
        assert len(r.items) == 5 and not set(r.items) & set(history)
    # share mode: the model's own old items keep their order at the head of every list
    model_only = plain.recommend(users, k=5)
    for r, m in zip(out, model_only, strict=True):
        old = [i for i in r.items if i not in rule.new_items]
        assert old == [i for i in m.items if i not in rule.new_items][: len(old)]
    # a rule fitted on another index is refused by name
    other = NewItemRule(loaded.mixture, "0123456789abcdef")
    other.save(grown)
    with pytest.raises(ValueError, match="was fitted on SID index 0123456789abcdef"):
        GroundedRecommender.from_pretrained(grown)
    (grown / "new_item_rule.safetensors").write_bytes(b"x")
    with pytest.raises(ValueError, match=r"not the file new_item_rule\.json was saved with"):
        GroundedRecommender.from_pretrained(grown)


def test_a_rule_that_chose_text_serves_without_the_model(world, tmp_path):
    import shutil

    grown = tmp_path / "grown"
    shutil.copytree(world["root"] / "grown", grown)
    with pytest.warns(UserWarning, match="holds no new-item rule"):
        plain = GroundedRecommender.from_pretrained(grown, num_beams=8)
    rule = plain.fit_new_items(LOGGED.values(), choose_beams=False)
    assert rule.beams == "model" and "choice_pairs" not in rule.fitted_on
    rule.beams = "text"
    rule.save(grown)
    served = GroundedRecommender.from_pretrained(grown, num_beams=8)
    assert served.new_item_rule.beams == "text"

    served.model = None  # a text rule decodes no model: nothing may call it
    users = [["0", "new0"], ["3", "4"]]
    out = served.recommend(users, k=5)
    expected = rule.apply(rule.mixture.text_beams(users, 8, served.trie), users, 5)
    assert [r.items for r in out] == [items[:5] for items in expected.items]
    # a rule saved before the choice existed (no "beams" key) mixes the model's beams
    record = json.loads((grown / "new_item_rule.json").read_text())
    del record["beams"]  # every field is checked on load, and a missing one named
    (grown / "new_item_rule.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match=r"missing fields \['beams'\], unknown fields \[\]"):
        NewItemRule.load(grown)


def test_grow_adapter_stores_the_rule(world, tmp_path):
    logged = write_histories(tmp_path / "logged.jsonl", LOGGED)
    root = world["root"]
    code = main(
        [
            "grow-adapter",
            "--adapter",
            str(root / "adapter"),
            "--parent-index",
            str(root / "sids"),
            "--sid-index",
            str(root / "sids-v2"),
            "--output_dir",
            str(tmp_path / "grown"),
            "--interactions",
            str(logged),
        ]
    )
    assert code == 0
    stored = NewItemRule.load(tmp_path / "grown")
    assert {"pairs": 5, "pairs_with_new_item": 3}.items() <= stored.fitted_on.items()
    assert stored.beams == stored.fitted_on["beams"] == "model" and stored.fitted_on["choice_pairs"] == 5
    bad = write_histories(tmp_path / "bad.jsonl", {"a": ["0", "unknown-item"]})
    assert (
        main(
            [
                "grow-adapter",
                "--adapter",
                str(root / "adapter"),
                "--parent-index",
                str(root / "sids"),
                "--sid-index",
                str(root / "sids-v2"),
                "--output_dir",
                str(tmp_path / "g2"),
                "--interactions",
                str(bad),
            ]
        )
        == 2
    )
    assert not (tmp_path / "g2").exists()


def test_merged_folder_gives_the_same_lists(world, recommender, tmp_path):
    folder = recommender.save_merged(tmp_path / "merged")
    assert (folder / "grounded_serving.json").is_file() and (folder / "sid_index").is_dir()
    assert not list(folder.glob("*.bin")) and not list(folder.glob("adapter_*"))
    merged = GroundedRecommender.from_pretrained(folder, num_beams=8)
    histories = list(HISTORIES.values())
    assert [r.items for r in merged.recommend(histories, k=5)] == [
        r.items for r in recommender.recommend(histories, k=5)
    ]
    with pytest.raises(ValueError, match="saved with SID index"):
        GroundedRecommender.from_pretrained(folder, sid_index=world["root"] / "sids-v2")


def test_cli_one_history_and_a_resumable_file(world, tmp_path, capsys):
    adapter = str(world["root"] / "adapter")
    assert (
        main(["recommend", "--adapter", adapter, "--history", "0,1,2", "--k", "4", "--num_beams", "8"]) == 0
    )
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].split()[:3] == ["rank", "item", "score"] and len(printed.splitlines()) == 5
    users = write_histories(tmp_path / "users.jsonl", HISTORIES)
    out = tmp_path / "out"
    argv = [
        "recommend",
        "--adapter",
        adapter,
        "--histories",
        str(users),
        "--k",
        "3",
        "--output_dir",
        str(out),
    ]
    assert main([*argv, "--decode_batch_size", "2"]) == 0
    lines = (out / "recommendations.jsonl").read_text().splitlines()
    assert [json.loads(line)["user"] for line in lines] == list(HISTORIES)
    assert not (out / "recommendations.jsonl.partial").exists()
    # resume: an interrupted run left two users and a torn line; only the third is decoded, same result
    (out / "recommendations.jsonl").unlink()
    (out / "recommendations.jsonl.partial").write_text(lines[0] + "\n" + lines[1] + "\n" + lines[2][:10])
    assert main(argv) == 0
    assert "(1 decoded now)" in capsys.readouterr().err
    assert (out / "recommendations.jsonl").read_text().splitlines() == lines
    assert main([*argv[:-4], "--k", "2", "--output_dir", str(out)]) == 2  # other settings: refused
    assert "other settings" in capsys.readouterr().err


def test_cli_fits_the_new_item_rule_for_one_call(world, tmp_path, capsys):
    logged = write_histories(tmp_path / "logged.jsonl", LOGGED)
    argv = ["recommend", "--adapter", str(world["root"] / "grown"), "--history", "0,new0", "--k", "5"]
    assert main([*argv, "--interactions", str(logged), "--output_dir", str(tmp_path / "o")]) == 0
    err = capsys.readouterr().err
    assert "new-item rule (share mode) fitted on 5 logged pairs (3 to a new item), 3 new items" in err
    assert "mixing the model beams (Recall@10 of 5 logged next items: model " in err
    (record,) = [
        json.loads(line) for line in (tmp_path / "o" / "recommendations.jsonl").read_text().splitlines()
    ]
    assert record["user"] == "history" and len(record["items"]) == 5 and record["new_items"] >= 1


def test_cli_bad_input_is_one_line(world, tmp_path, capsys):
    adapter = str(world["root"] / "adapter")
    for argv, message in (
        (["--history", "0,nope"], "items ['nope'] are not in the SID index"),
        (["--history", "0", "--k", "999"], "k=999 exceeds the catalogue"),
        (["--histories", str(tmp_path / "x.jsonl")], "pass --output_dir"),
        ([], "give one of --history"),
    ):
        assert main(["recommend", "--adapter", adapter, *argv]) == 2
        assert message in capsys.readouterr().err
    assert main(["recommend", "--adapter", adapter, "--history", "0,nope", "--skip_unknown", "--k", "2"]) == 0
    assert "skipped 1 unknown history items" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"user": "a", "history": ["0"]}\n{"user": "a", "history": ["1"]}\n')
    assert (
        main(
            ["recommend", "--adapter", adapter, "--histories", str(bad), "--output_dir", str(tmp_path / "o")]
        )
        == 2
    )
    assert "appears twice" in capsys.readouterr().err
    assert not (tmp_path / "o" / "recommendations.jsonl").exists()


def test_recommend_help_parses_normally(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["recommend", "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert "--histories" in text and "--config" in text and "--skip_unknown" in text


def test_hub_id_without_network_is_a_clear_error(tmp_path, monkeypatch, capsys):
    from peft_grounded.hub.repo import GroundedHubError

    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    with pytest.raises(
        GroundedHubError, match=r"cannot load 'someone/grounded-adapter'.*Nothing was written"
    ):
        GroundedRecommender.from_pretrained("someone/grounded-adapter")  # HF_HUB_OFFLINE=1 in the tests
    out = tmp_path / "out"
    code = main(
        ["recommend", "--adapter", "someone/grounded-adapter", "--history", "1", "--output_dir", str(out)]
    )
    assert code == 2 and "HF_HUB_OFFLINE" in capsys.readouterr().err
    assert not out.exists()
    assert not (tmp_path / "home").exists() or not any((tmp_path / "home").rglob("*.safetensors"))


def test_hub_unreachable_endpoint_is_a_clear_error(monkeypatch, tmp_path):
    import socket

    from helpers.hub_fixtures import point_client_at

    from peft_grounded.hub.repo import GroundedHubError

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    point_client_at(f"http://127.0.0.1:{port}", tmp_path / "home", monkeypatch)
    with pytest.raises(GroundedHubError, match=r"cannot reach the Hub.*Nothing was written"):
        GroundedRecommender.from_pretrained("someone/grounded-adapter")
    assert not any((tmp_path / "home").rglob("*.safetensors"))


def test_pushed_adapter_recommends_in_a_fresh_process(world, hub_endpoint, hub_env, tmp_path):
    import shutil

    from peft_grounded.hub import push_grounded

    grown = tmp_path / "grown"
    shutil.copytree(world["root"] / "grown", grown)
    rule = NewItemRule.fit(world["child"], LOGGED.values())
    rule.save(grown)
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo("tester/base", exist_ok=True)
    api.upload_folder(repo_id="tester/base", folder_path=world["base"])  # the base, on the same Hub
    push_grounded(
        str(grown), "tester/grown-recommender", index=world["child"], card_facts={"base_model": "tester/base"}
    )
    local = GroundedRecommender.from_pretrained(grown, num_beams=8).recommend([["0", "new0"], ["3"]], k=4)
    code = (
        "import json, warnings; warnings.simplefilter('error', UserWarning)\n"
        "from peft_grounded import GroundedRecommender\n"
        "r = GroundedRecommender.from_pretrained('tester/grown-recommender', num_beams=8)\n"
        "print(json.dumps([x.items for x in r.recommend([['0', 'new0'], ['3']], k=4)]))\n"
    )
    env = {**hub_env, "PYTHONPATH": os.getcwd()}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [r.items for r in local]
    # and the command line, in a fresh process, from the Hub id
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "peft_grounded.cli",
            "recommend",
            "--adapter",
            "tester/grown-recommender",
            "--history",
            "0,new0",
            "--k",
            "4",
            "--num_beams",
            "8",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert cli.returncode == 0, cli.stderr[-3000:]
    assert [line.split()[1] for line in cli.stdout.splitlines()[1:]] == local[0].items


@pytest.mark.cuda
def test_a_cuda_recommender_gives_the_cpu_lists(world):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    folder = world["root"] / "adapter"
    histories = list(HISTORIES.values())
    on_cpu = GroundedRecommender.from_pretrained(folder, num_beams=8, device="cpu", dtype="float32")
    on_gpu = GroundedRecommender.from_pretrained(folder, num_beams=8, device="cuda", dtype="float32")
    assert [r.items for r in on_gpu.recommend(histories, k=5)] == [
        r.items for r in on_cpu.recommend(histories, k=5)
    ]


def test_the_benchmark_compares_like_with_like(world):
    """bench_recommend's `generate` engine (transformers' beam search with prefix_allowed_tokens_fn over the
    same trie) returns the recommender's lists on the same model, so its speed ratio is at equal lists."""
    from benchmarks import bench_recommend
    from peft_grounded.prompts import inference_prompts

    recommender = GroundedRecommender.from_pretrained(world["root"] / "adapter", num_beams=8, dtype="float32")
    histories = list(HISTORIES.values())
    ours = [r.items for r in recommender.recommend(histories, k=5, exclude_history=False)]
    examples = [(str(u), h, None) for u, h in enumerate(histories)]
    _, prompts, _ = inference_prompts(
        examples, recommender.index, recommender.tokenizer, None, recommender.fmt
    )
    theirs = bench_recommend.generate_top(recommender, prompts, beams=8, k=5)
    assert bench_recommend.compare(ours, theirs, 5) == (1.0, 1.0)
    # and under the SID-only softmax (the recipe's adapters): generate renormalises over the same rows
    sid = GroundedRecommender(
        recommender.model,
        recommender.tokenizer,
        recommender.index,
        recommender.fmt,
        num_beams=8,
        sid_softmax=True,
    )
    ours = [r.items for r in sid.recommend(histories, k=5, exclude_history=False)]
    theirs = bench_recommend.generate_top(sid, prompts, beams=8, k=5)
    assert bench_recommend.compare(ours, theirs, 5) == (1.0, 1.0)
    assert bench_recommend.compare([["a", "b"]], [["b", "c"]], 2) == (0.0, 0.5)


def test_the_benchmarks_adapter_decodes_as_recorded(world, tmp_path):
    """bench_recommend's (and bench_decode_limit's) adapter keeps its SID record, which PEFT's save_pretrained
    drops: loaded back it decodes over the SID rows (or the whole vocabulary) as recorded, with no warning."""
    import warnings

    from benchmarks import bench_recommend

    for sid_softmax in (True, False):
        folder = bench_recommend.adapter_for(
            world["base"], world["parent"], tmp_path / str(sid_softmax), sid_softmax
        )
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)  # a lost record warns
            loaded = GroundedRecommender.from_pretrained(folder, sid_index=world["parent"], num_beams=4)
        assert (loaded.sid_rows is not False) == sid_softmax
