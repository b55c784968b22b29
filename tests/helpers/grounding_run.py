"""A small grounding run as a script, for the crash-resume and multi-process tests.

python tests/helpers/grounding_run.py OUT --max-steps 6 [--kill-at 4] [--resume] [--batch 4] [--lr 0.05]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

if not __package__:  # run by path: tests/ on sys.path, as under pytest (``helpers``, ``conftest``)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("output_dir")
    parser.add_argument("--max-steps", type=int, default=6)
    parser.add_argument("--kill-at", type=int, default=None, help="SIGKILL the process after this checkpoint")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--init", default="mean")
    args = parser.parse_args()

    import torch
    from conftest import build_tiny_model
    from transformers import AutoTokenizer, TrainerCallback

    import peft_grounded
    from helpers.toy_catalogue import toy_catalogue, toy_index
    from peft_grounded import assets
    from peft_grounded.training.grounding import GroundingTrainer, grounding_dataset
    from peft_grounded.training.stage_config import GroundingConfig

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(assets.smollm2())
    catalogue = toy_catalogue()
    index = toy_index(catalogue)
    model = build_tiny_model("llama", False)
    new = peft_grounded.add_tokens(tokenizer, model, index.token_strings)

    class Kill(TrainerCallback):
        """A crash: the process dies at the start of the step after checkpoint ``kill_at`` was written."""

        def on_step_begin(self, a, state, control, **kwargs):
            if args.kill_at is not None and state.global_step == args.kill_at:
                os.kill(os.getpid(), signal.SIGKILL)

    config = GroundingConfig(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch,
        learning_rate=args.lr,
        save_steps=2,
        logging_steps=1,
        use_cpu=True,
        bf16=False,
        max_length=64,
        disable_tqdm=True,
        seed=0,
        dataloader_num_workers=0,
    )
    trainer = GroundingTrainer(
        model,
        config,
        peft_config=peft_grounded.GroundedTokenConfig(token_indices=new, init=args.init),
        train_dataset=grounding_dataset(catalogue, index, tokenizer),
        processing_class=tokenizer,
        callbacks=[Kill()],
    )
    trainer.train(resume_from_checkpoint=True if args.resume else None)
    layer = trainer.model.get_input_embeddings()
    rows = {
        "input": layer.grounded_embedding["default"].detach(),
        "output": layer.grounded_head["default"].detach(),
    }
    if trainer.is_world_process_zero():
        torch.save(rows, Path(args.output_dir) / "final_rows.pt")
    torch.save(rows, Path(args.output_dir) / f"rows_rank{os.environ.get('RANK', '0')}.pt")  # every rank


if __name__ == "__main__":
    main()
