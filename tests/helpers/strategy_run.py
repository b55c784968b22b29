"""One strategy through the runner as a script, for the multi-process test (tests/test_recommend_distributed.py).

python tests/helpers/strategy_run.py MODEL_DIR OUT RESULTS_DIR
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

if not __package__:  # run by path: tests/ on sys.path, as under pytest (``helpers``)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    model_dir, out, results = sys.argv[1:4]
    from helpers.toy_catalogue import toy_catalogue, toy_index
    from peft_grounded.evaluation import EvalSettings
    from peft_grounded.pipeline import Budget, Experiment, run_strategy
    from peft_grounded.prompts import PromptFormat

    catalogue = toy_catalogue()
    experiment = Experiment(
        model_dir, catalogue, toy_index(catalogue), fmt=PromptFormat(objective="sequence")
    )
    budget = Budget.from_training(
        dict(per_device_train_batch_size=2, logging_steps=1, disable_tqdm=True),
        grounding=dict(max_steps=2),
        sft=dict(max_steps=3, max_minutes=10),  # the time schedule: every rank must use rank 0's clock
        lora=dict(r=2),
        evaluation=EvalSettings(users=4, num_beams=10, ks=(1, 5, 10)),
        eval_every=1,  # beam search on every rank
        curve_every=1,  # validation NLL on every rank
        curve_users=3,
    )
    record = run_strategy("gti", experiment, budget, out)
    rank = int(os.environ.get("RANK", "0"))
    Path(results).mkdir(parents=True, exist_ok=True)
    keep = {k: record[k] for k in ("metrics", "likelihood")}
    for name, points in (
        ("validation_curve", record["validation_curve"]),
        ("valid_curve", record["curve"]["sft"]["valid"]),
    ):
        keep[name] = [{k: v for k, v in p.items() if k != "seconds"} for p in points]  # each rank's own clock
    (Path(results) / f"rank{rank}.json").write_text(json.dumps(keep, sort_keys=True))


if __name__ == "__main__":
    main()
