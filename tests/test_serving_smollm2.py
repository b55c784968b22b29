"""End to end on the real SmolLM2-135M (slow): an adapter trained on a toy catalogue's SIDs, grown onto three
new items with the new-item rule stored, recommended for in fresh processes, from a local folder and from the
loopback Hub, in Python and on the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers.growth_fixtures import grown_indices

from peft_grounded.sids.extended_base import save_sid_record

pytestmark = pytest.mark.slow

LOGGED = {"a": ["0", "4", "new0"], "b": ["1", "new0", "new1"], "c": ["2", "6"], "d": ["3", "new2"]}


@pytest.fixture(scope="module")
def grown_folder(tmp_path_factory):
    import torch

    from peft_grounded import assets
    from peft_grounded.new_items import grow_adapter
    from peft_grounded.serving import NewItemRule
    from peft_grounded.sids.extended_base import RowStart, sid_model

    root = tmp_path_factory.mktemp("smollm2-serving")
    parent, child = grown_indices()
    tokenizer, model = sid_model(str(assets.smollm2()), parent, start=RowStart(init="centroid"))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # "trained": the rows moved off their start
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.01 * torch.randn(p.shape, generator=generator))
    grown = grow_adapter(model, tokenizer, parent, child)
    grown.save_pretrained(root / "grown")
    save_sid_record(grown, root / "grown")
    child.save(root / "grown" / "sid_index")
    NewItemRule.fit(child, LOGGED.values()).save(root / "grown")
    return root / "grown"


def _python(code: str, env: dict) -> str:
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


RECOMMEND = (
    "import json, sys\n"
    "from peft_grounded import GroundedRecommender\n"
    "r = GroundedRecommender.from_pretrained(sys.argv[1] if len(sys.argv) > 1 else {where!r}, num_beams=10)\n"
    "out = r.recommend([['0', 'new0'], ['3', '7']], k=5)\n"
    "print(json.dumps([[x.items, x.new_items] for x in out]))\n"
)


def test_fresh_processes_recommend_from_a_folder_and_the_hub(grown_folder, hub_endpoint, hub_env, tmp_path):
    from peft_grounded.hub import push_grounded

    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    local = json.loads(_python(RECOMMEND.format(where=str(grown_folder)), env))
    assert all(len(items) == 5 for items, _ in local)
    assert local[0][1] >= 1  # the user whose last item is new gets new items, by the stored rule
    cli = subprocess.run(
        [sys.executable, "-m", "peft_grounded.cli", "recommend", "--adapter", str(grown_folder),
         "--history", "0,new0", "--k", "5", "--num_beams", "10"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr[-3000:]
    assert [line.split()[1] for line in cli.stdout.splitlines()[1:]] == local[0][0]

    facts = {"base_model": "HuggingFaceTB/SmolLM2-135M-Instruct"}  # the packaged copy is what loads
    push_grounded(
        str(grown_folder), "tester/smollm2-grown", index=grown_folder / "sid_index", card_facts=facts
    )
    hub = json.loads(
        _python(RECOMMEND.format(where="tester/smollm2-grown"), {**hub_env, "PYTHONPATH": os.getcwd()})
    )
    assert hub == local
    users = tmp_path / "users.jsonl"
    users.write_text("".join(json.dumps({"user": u, "history": h}) + "\n" for u, h in LOGGED.items()))
    cli = subprocess.run(
        [sys.executable, "-m", "peft_grounded.cli", "recommend", "--adapter", "tester/smollm2-grown",
         "--histories", str(users), "--k", "3", "--output_dir", str(tmp_path / "out")],
        env={**hub_env, "PYTHONPATH": os.getcwd()}, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr[-3000:]
    lines = (tmp_path / "out" / "recommendations.jsonl").read_text().splitlines()
    assert [json.loads(line)["user"] for line in lines] == list(LOGGED)


def test_served_recall_is_the_evaluated_recall_on_smollm2(tmp_path):
    """On the real SmolLM2 with an adapter that trained under the SID-only softmax: the default (merged)
    recommender's test Recall@5 equals `evaluate`'s, user by user; decoding it over the whole vocabulary (what
    the merge silently did before) serves other lists."""
    import torch
    from helpers.toy_catalogue import toy_catalogue, toy_index

    from peft_grounded import GroundedRecommender, add_lora, assets
    from peft_grounded.evaluation import EvalSettings
    from peft_grounded.evaluation.evaluator import evaluate_adapter
    from peft_grounded.evaluation.metrics import target_rank
    from peft_grounded.sids.extended_base import RowStart, sid_model
    from peft_grounded.training.sft.recommendation_trainer import record_sid_softmax

    catalogue = toy_catalogue()
    index = toy_index(catalogue)
    _, model = sid_model(str(assets.smollm2()), index, start=RowStart(init="centroid"))
    add_lora(model, r=4, target_modules=["q_proj", "v_proj"])
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # "trained": every trainable weight moved off its start
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.02 * torch.randn(p.shape, generator=generator))
    record_sid_softmax(model, True)
    model.save_pretrained(tmp_path / "adapter")
    save_sid_record(model, tmp_path / "adapter")
    index.save(tmp_path / "adapter" / "sid_index")

    settings = EvalSettings(ks=[5], num_beams=10, cold=False, exclude_history=True)
    evaluated = evaluate_adapter(str(tmp_path / "adapter"), index, catalogue, settings, parts=("test",))
    records = {r["user"]: r for r in evaluated.users["test"]}
    split = catalogue.leave_one_out().users
    histories, users = [[*u.history, u.valid] for u in split], [u.user_id for u in split]
    served = GroundedRecommender.from_pretrained(tmp_path / "adapter", num_beams=10)  # merged, the default
    lists = {r.user: r.items for r in served.recommend(histories, k=5, users=users)}
    assert lists == {u: r["items"] for u, r in records.items()}
    ranks = {u.user_id: target_rank(lists[u.user_id], u.test) for u in split}
    assert ranks == {u: r["rank"] for u, r in records.items()}
    recall = sum(r is not None for r in ranks.values()) / len(ranks)
    assert recall == evaluated.metrics["test"]["all"]["recall@5"]
    full_vocabulary = GroundedRecommender.from_pretrained(
        tmp_path / "adapter", num_beams=10, sid_softmax=False
    )
    other = {r.user: r.items for r in full_vocabulary.recommend(histories, k=5, users=users)}
    assert other != lists
