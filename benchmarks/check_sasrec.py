"""Cross-check the project's SASRec (peft_grounded.sids.sasrec) against RecBole's on the same data.

Ours (always): ``fit_sasrec`` on ``load_catalogue(name).leave_one_out()``, scored on every test user with
``peer_records`` (full ranking over the catalogue, the user's history excluded), Recall@10 / NDCG@10.

RecBole (with ``--recbole-venv``, a virtual environment holding recbole 1.2.1 and its dependencies, kept
outside the repository): its own ``SASRec`` with ``loss_type=CE``, leave-one-out ``LS valid_and_test``,
full ranking, early stopping on validation NDCG@10, with the same SASRecConfig values as ours (hidden size,
blocks, heads, feed-forward width = hidden size, dropout, max length, learning rate, patience, seed), run in
that environment by this same file (``--recbole-worker``). RecBole trains in processes of at most
``--recbole-chunk-minutes`` each (its state kept in safetensors between them). Data: ``ours`` writes our
catalogue's sequences as a RecBole atomic file (the position in the user's sequence as timestamp: the very
same interactions and order); ``native`` (ML-100K only) reads RecBole's own ``ml-100k`` files as RecBole
orders them. The worker reports RecBole's own test metrics (RecBole does not exclude the history for
sequential models) and the same model's metrics with the history excluded (our protocol), and the
sequences it trained on, which are compared with ours.

    OMP_NUM_THREADS=1 python benchmarks/check_sasrec.py --config '{"bf16": true}' --minutes 9
    OMP_NUM_THREADS=1 python benchmarks/check_sasrec.py --datasets amazon-office --skip-ours \\
        --config '{"dropout": 0.2, "learning_rate": 0.001}' --recbole-venv /work/scratch/recbole-venv \\
        --recbole-batch-size 256 --recbole-chunks 3
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

try:
    from benchmarks._args import parse
except ModuleNotFoundError:  # run as a file: its folder is on sys.path, not the repository
    from _args import parse

DATASETS = {"movielens-100k": "movielens-100k", "amazon-office": "/work/shared/data/amazon-office"}


def _catalogue(name: str):
    from peft_grounded.sids import load_catalogue

    return load_catalogue(DATASETS.get(name, name))


def run_ours(name: str, overrides: dict, catalogue=None) -> dict:
    """Train our SASRec on ``name`` (or on ``catalogue``) and score it on every validation and test user."""
    from peft_grounded.evaluation.peers import peer_records, peer_results
    from peft_grounded.evaluation.reports import EvalSettings
    from peft_grounded.sids.sasrec import SASRecConfig, fit_sasrec

    catalogue = catalogue or _catalogue(name)
    split = catalogue.leave_one_out()
    config = SASRecConfig(**overrides)
    cpu = time.process_time()
    model = fit_sasrec(split, catalogue.item_ids, config)
    cpu = time.process_time() - cpu
    settings = EvalSettings(ks=(10,), cold=False)
    results = peer_results(peer_records(model, split, ("valid", "test"), settings), settings)
    return {
        "dataset": name,
        "impl": "ours",
        "test_recall@10": results["test"]["all"]["recall@10"],
        "test_ndcg@10": results["test"]["all"]["ndcg@10"],
        "valid_ndcg@10": results["valid"]["all"]["ndcg@10"],
        "users": results["test"]["all"]["users"],
        "best_epoch": model.best_epoch,
        "epochs": len(model.history),
        "minutes": model.train_seconds / 60,
        "cpu_minutes": cpu / 60,
        "threads": model.threads,
        "config": overrides,
        "history": model.history,
    }


# ------------------------------------------------------------------------------------------------ RecBole


def _write_atomic(catalogue, folder: Path, dataset: str) -> None:
    """Our sequences as ``<dataset>.inter``; the timestamp is the position in the user's sequence."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["user_id:token\titem_id:token\ttimestamp:float"]
    for user, seq in catalogue.sequences.items():
        lines += [f"{user}\t{item}\t{t}" for t, item in enumerate(seq)]
    (folder / f"{dataset}.inter").write_text("\n".join(lines) + "\n", encoding="utf-8")


def _resolved(overrides: dict) -> dict:
    from dataclasses import asdict

    from peft_grounded.sids.sasrec import SASRecConfig

    return asdict(SASRecConfig(**overrides))


def run_recbole(name: str, venv: Path, data: str, overrides: dict, recbole_args: dict) -> dict:
    """Run RecBole's SASRec in ``venv`` on ``name`` and compare the sequences it used with ours."""
    catalogue = _catalogue(name)
    with tempfile.TemporaryDirectory() as tmp:
        if data == "native":
            if name != "movielens-100k":
                raise SystemExit("--recbole-data native exists for movielens-100k only")
            from peft_grounded import assets

            data_path, dataset = Path(assets.movielens_100k()).parent, "ml-100k"
        else:
            dataset = "ours-" + Path(DATASETS.get(name, name)).name
            data_path = Path(tmp)
            _write_atomic(catalogue, data_path / dataset, dataset)
        job = {
            "data_path": str(data_path),
            "dataset": dataset,
            "out": str(Path(tmp) / "result.json"),
            "state": str(Path(tmp) / "state"),
            "checkpoint_dir": str(Path(tmp) / "saved"),
            "overrides": _resolved(overrides),  # every SASRecConfig value, defaults included
            **recbole_args,
        }
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        chunks = recbole_args.get("chunks", 1)
        for chunk in range(chunks):  # each chunk a process of at most chunk_minutes of training
            job.update(chunk=chunk, last_chunk=chunk == chunks - 1)
            subprocess.run(  # in tmp: RecBole writes its logs into the working folder
                [
                    str(venv / "bin" / "python"),
                    str(Path(__file__).resolve()),
                    "--recbole-worker",
                    json.dumps(job),
                ],
                check=True,
                env=env,
                cwd=tmp,
            )
            result = json.loads(Path(job["out"]).read_text(encoding="utf-8"))
            print(f"RecBole chunk {chunk + 1}/{chunks}: {result['epochs']} epochs", flush=True)
            if result["done"]:
                break
    theirs = result.pop("sequences")
    ours = {u: list(s) for u, s in catalogue.sequences.items()}
    same = sum(theirs.get(u) == s for u, s in ours.items())
    same_targets = sum(theirs.get(u, [])[-2:] == s[-2:] for u, s in ours.items())
    result.update(
        dataset=name,
        impl=f"RecBole ({data} data)",
        data_check=(
            f"{len(theirs)} users / {sum(map(len, theirs.values()))} interactions vs ours {len(ours)} / "
            f"{catalogue.n_interactions}; identical sequences {same}, identical (valid, test) {same_targets}"
        ),
    )
    return result


class _RecBoleState:
    """A RecBole run between chunks: weights, best weights and Adam's state in safetensors, the rest in JSON
    (RecBole's own checkpoints are pickles, which this project never loads)."""

    def __init__(self, folder: Path) -> None:
        self.tensors, self.meta = folder / "state.safetensors", folder / "state.json"

    def save(self, model, trainer, record: list, best_state: dict, spent: dict) -> None:
        from safetensors.torch import save_file

        self.tensors.parent.mkdir(parents=True, exist_ok=True)
        tensors = {f"model.{k}": v.contiguous() for k, v in model.state_dict().items()}
        tensors.update({f"best.{k}": v.contiguous() for k, v in best_state.items()})
        for index, slots in trainer.optimizer.state_dict()["state"].items():
            tensors.update({f"adam.{index}.{name}": v.reshape(-1).contiguous() for name, v in slots.items()})
        save_file(tensors, self.tensors)
        meta = {
            "next_epoch": record[-1]["epoch"] if record else 0,
            "cur_step": trainer.cur_step,
            "best_valid_score": float(trainer.best_valid_score),
            "record": record,
            "spent": spent,
        }
        self.meta.write_text(json.dumps(meta), encoding="utf-8")

    def restore(self, model, trainer) -> tuple[list, dict, dict]:
        if not self.meta.is_file():
            return [], {}, {"seconds": 0.0, "cpu_seconds": 0.0}
        from safetensors.torch import load_file

        meta, tensors = json.loads(self.meta.read_text(encoding="utf-8")), load_file(self.tensors)
        model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
        best = {k[5:]: v for k, v in tensors.items() if k.startswith("best.")}
        adam: dict[int, dict] = {}
        for key, value in tensors.items():
            if key.startswith("adam."):
                _, index, name = key.split(".")
                adam.setdefault(int(index), {})[name] = value.reshape(()) if name == "step" else value
        shapes = {i: p.shape for i, p in enumerate(model.parameters())}
        adam = {
            i: {n: v if n == "step" else v.reshape(shapes[i]) for n, v in slots.items()}
            for i, slots in adam.items()
        }
        groups = trainer.optimizer.state_dict()["param_groups"]
        trainer.optimizer.load_state_dict({"state": adam, "param_groups": groups})
        trainer.start_epoch, trainer.cur_step = meta["next_epoch"], meta["cur_step"]
        trainer.best_valid_score = meta["best_valid_score"]
        return meta["record"], best, meta["spent"]


def recbole_worker(job: dict) -> None:
    """Inside the RecBole environment: train SASRec (CE), test it, write the result JSON."""
    import torch
    from recbole.config import Config
    from recbole.data import create_dataset, data_preparation
    from recbole.model.sequential_recommender import SASRec
    from recbole.trainer import Trainer
    from recbole.utils import init_seed

    over = job["overrides"]  # every SASRecConfig field, resolved by the caller
    dropout = over["dropout"]
    config = Config(
        model="SASRec",
        dataset=job["dataset"],
        config_dict={
            "data_path": job["data_path"],
            "checkpoint_dir": job["checkpoint_dir"],
            "load_col": {"inter": ["user_id", "item_id", "timestamp"]},
            "USER_ID_FIELD": "user_id",
            "ITEM_ID_FIELD": "item_id",
            "TIME_FIELD": "timestamp",
            "MAX_ITEM_LIST_LENGTH": over["max_length"],
            "hidden_size": over["hidden_size"],
            "inner_size": job.get("inner_size") or over["hidden_size"],
            "n_layers": over["num_blocks"],
            "n_heads": over["num_heads"],
            "hidden_dropout_prob": dropout,
            "attn_dropout_prob": dropout,
            "loss_type": "CE",
            "train_neg_sample_args": None,
            "learning_rate": over["learning_rate"],
            "weight_decay": over["weight_decay"],
            "train_batch_size": job.get("train_batch_size", 2048),
            "epochs": job.get("epochs", 200),
            "stopping_step": over["patience"],
            "eval_args": {
                "split": {"LS": "valid_and_test"},
                "order": "TO",
                "mode": "full",
                "group_by": "user",
            },
            "metrics": ["Recall", "NDCG"],
            "topk": [10],
            "valid_metric": "NDCG@10",
            "eval_batch_size": 1024,
            "seed": over["seed"],
            "reproducibility": True,
            "device": "cpu",
            "use_gpu": False,
            "show_progress": False,
            "state": "WARNING",
        },
    )
    # Each chunk its own seed: a resumed run shuffles its batches afresh (weights and Adam state are restored).
    init_seed(config["seed"] + job.get("chunk", 0), config["reproducibility"])
    dataset = create_dataset(config)
    train_data, valid_data, test_data = data_preparation(config, dataset)
    # After data_preparation the dataset holds one row per target, in RecBole's order (stable sort by time):
    # a user's sequence is its first row's history followed by every row's target.
    uid, iid = dataset.uid_field, dataset.iid_field
    feat = dataset.inter_feat
    lists, lengths = feat[iid + config["LIST_SUFFIX"]], feat[config["ITEM_LIST_LENGTH_FIELD"]]
    internal: dict[int, list[int]] = {}
    for row, (u, i) in enumerate(zip(feat[uid].tolist(), feat[iid].tolist(), strict=True)):
        if u not in internal:
            internal[u] = lists[row, : int(lengths[row])].tolist()
        internal[u].append(i)
    model = SASRec(config, train_data.dataset)
    trainer = Trainer(config, model)
    state = _RecBoleState(Path(job["state"]))
    record, best_state, spent = state.restore(model, trainer)
    budget = job.get("chunk_minutes")
    start, cpu = time.perf_counter(), time.process_time()

    class OutOfTime(Exception):
        pass

    def after_epoch(epoch: int, score: float) -> None:
        record.append(
            {
                "epoch": epoch + 1,
                "valid_ndcg@10": score,
                "best": trainer.cur_step == 0,
                "seconds": spent["seconds"] + time.perf_counter() - start,
                "cpu_seconds": spent["cpu_seconds"] + time.process_time() - cpu,
            }
        )
        if trainer.cur_step == 0:  # RecBole's own rule (>=): the newest of equal scores is the best
            best_state.update({k: v.detach().clone() for k, v in model.state_dict().items()})
        if budget is not None and time.perf_counter() - start > budget * 60:
            raise OutOfTime

    done = True
    try:
        # saved=False: RecBole's checkpoints are pickles; the best weights are kept in memory instead.
        trainer.fit(train_data, valid_data, saved=False, show_progress=False, callback_fn=after_epoch)
    except OutOfTime:
        done = bool(job.get("last_chunk", True))
    spent = {
        "seconds": spent["seconds"] + time.perf_counter() - start,
        "cpu_seconds": spent["cpu_seconds"] + time.process_time() - cpu,
    }
    if not done:  # more chunks to come: keep the state (safetensors + JSON), no test yet
        state.save(model, trainer, record, best_state, spent)
        Path(job["out"]).write_text(json.dumps({"done": False, "epochs": len(record)}), encoding="utf-8")
        return
    model.load_state_dict(best_state)
    theirs = trainer.evaluate(test_data, load_best_model=False)
    # The same model under our protocol: the user's whole history excluded from the ranking.
    hits, gains, n = 0, 0.0, 0
    model.eval()
    with torch.no_grad():
        for interaction, _, _, _ in test_data:
            scores = model.full_sort_predict(interaction)
            scores[:, 0] = -math.inf
            targets = interaction[iid]
            for row, (u, target) in enumerate(zip(interaction[uid].tolist(), targets.tolist(), strict=True)):
                scores[row, internal[u][:-1]] = -math.inf
                rank = int((scores[row] > scores[row, target]).sum())
                hits += rank < 10
                gains += 1 / math.log2(rank + 2) if rank < 10 else 0.0
                n += 1
    best = [r["epoch"] for r in record if r["best"]]
    result = {
        "test_recall@10": theirs["recall@10"],
        "test_ndcg@10": theirs["ndcg@10"],
        "test_recall@10_history_excluded": hits / n,
        "test_ndcg@10_history_excluded": gains / n,
        "valid_ndcg@10": trainer.best_valid_score,
        "users": n,
        "best_epoch": best[-1] if best else None,
        "history": record,
        "epochs": len(record),
        "minutes": spent["seconds"] / 60,
        "cpu_minutes": spent["cpu_seconds"] / 60,
        "done": True,
        "threads": torch.get_num_threads(),
        "config": {
            k: config[k]
            for k in (
                "MAX_ITEM_LIST_LENGTH",
                "hidden_size",
                "inner_size",
                "n_layers",
                "n_heads",
                "hidden_dropout_prob",
                "train_batch_size",
                "learning_rate",
            )
        },
        "sequences": {
            dataset.id2token(uid, u): [str(t) for t in dataset.id2token(iid, seq)]
            for u, seq in internal.items()
        },
    }
    Path(job["out"]).write_text(json.dumps(result), encoding="utf-8")


# ------------------------------------------------------------------------------------------------ table


def _fmt(value, digits: int = 4) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def print_table(rows: list[dict]) -> None:
    head = [
        "dataset",
        "impl",
        "test R@10",
        "test NDCG@10",
        "R@10 hist. excl.",
        "best epoch",
        "epochs",
        "minutes",
        "CPU min",
        "threads",
    ]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        cells = [
            r["dataset"],
            r["impl"],
            _fmt(r["test_recall@10"]),
            _fmt(r["test_ndcg@10"]),
            _fmt(
                r.get("test_recall@10_history_excluded", r["test_recall@10"] if r["impl"] == "ours" else None)
            ),
            _fmt(r["best_epoch"]),
            _fmt(r["epochs"]),
            _fmt(r["minutes"], 1),
            _fmt(r["cpu_minutes"], 1),
            _fmt(r["threads"]),
        ]
        print("| " + " | ".join(cells) + " |")
    for r in rows:
        if "data_check" in r:
            print(f"- {r['dataset']}, {r['impl']}: {r['data_check']}")


@dataclass
class Settings:
    datasets: list[str] = field(
        default_factory=lambda: ["movielens-100k", "amazon-office"],
        metadata={"help": f"names ({', '.join(DATASETS)}) or catalogue paths"},
    )
    sasrec_config: str = field(
        default="{}",
        metadata={"help": "SASRecConfig overrides as JSON (ours and RecBole's)", "aliases": ["--config"]},
    )
    minutes: float | None = field(default=None, metadata={"help": "training budget per run (both)"})
    recbole_venv: Path | None = field(default=None, metadata={"help": "run RecBole's SASRec in this venv"})
    recbole_data: Literal["ours", "native", "both"] = field(
        default="ours", metadata={"help": "the data RecBole reads (native: its own ml-100k files)"}
    )
    recbole_epochs: int = field(default=200, metadata={"help": "RecBole's epochs"})
    recbole_batch_size: int = field(default=2048, metadata={"help": "RecBole's train_batch_size"})
    recbole_inner_size: int | None = field(
        default=None,
        metadata={"help": "RecBole's feed-forward width (None: hidden_size, as ours; RecBole's own: 256)"},
    )
    recbole_chunk_minutes: float = field(
        default=8.0,
        metadata={"help": "RecBole trains in processes of at most this many minutes (plus one epoch)..."},
    )
    recbole_chunks: int = field(
        default=1, metadata={"help": "... and at most this many of them, resuming from a safetensors state"}
    )
    skip_ours: bool = field(default=False, metadata={"help": "RecBole's row only"})
    json: Path | None = field(default=None, metadata={"help": "also write the rows here"})

    def __post_init__(self) -> None:
        overrides = json.loads(self.sasrec_config)
        if not isinstance(overrides, dict):
            raise SystemExit(
                f"--config takes a JSON object of SASRecConfig fields, got {self.sasrec_config!r}"
            )


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--recbole-worker"]:  # run_recbole's job, in RecBole's venv (which has no TRL)
        recbole_worker(json.loads(argv[1]))
        return
    # --config is this script's JSON of SASRecConfig overrides, not a YAML file of flags
    args = parse(Settings, argv, prog="check_sasrec.py", description=__doc__, config_file=False)
    overrides = json.loads(args.sasrec_config)
    if args.minutes is not None:
        overrides["max_minutes"] = args.minutes
    rows = []
    for name in args.datasets:
        if not args.skip_ours:
            rows.append(run_ours(name, overrides))
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "history"}), flush=True)
        if args.recbole_venv is not None:
            kinds = ["ours", "native"] if args.recbole_data == "both" else [args.recbole_data]
            for data in kinds:
                if data == "native" and name != "movielens-100k":
                    continue
                recbole_args = {
                    "epochs": args.recbole_epochs,
                    "chunk_minutes": args.recbole_chunk_minutes,
                    "chunks": args.recbole_chunks,
                    "train_batch_size": args.recbole_batch_size,
                    "inner_size": args.recbole_inner_size,
                }
                rows.append(run_recbole(name, args.recbole_venv, data, overrides, recbole_args))
                print(json.dumps({k: v for k, v in rows[-1].items() if k != "history"}), flush=True)
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
