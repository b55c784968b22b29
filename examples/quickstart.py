"""Quickstart: the adapter's user flow on SmolLM2-135M and MovieLens-100K, offline, in a few minutes on a CPU.

    python examples/quickstart.py [--output_dir runs/quickstart] [--max_steps 10]

1. Semantic IDs for MovieLens-100K (all-MiniLM-L6-v2 + RQ-KMeans), and their per-token centroids.
2. Add the SID tokens to SmolLM2, wrap it with a centroid-initialised GroundedTokenConfig.
3. Ground the new rows through TRL's SFTTrainer (backbone frozen), save, reload in PEFT's usual way. The
   grounding config is a TRL SFTConfig whose unset fields the machine chooses: bf16 where the CPU (or GPU)
   runs it natively, the CPU unless CUDA is available.
4. Stack a LoRA for the recommendation SFT, and merge the grounded rows into the base model.
5. Recommend for one user with the saved adapter (GroundedRecommender; this adapter is grounded, not yet
   trained to recommend, so the list shows the path, not a good recommender).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from peft import PeftModel, get_peft_model

import peft_grounded
from peft_grounded import assets
from peft_grounded.sids import SIDIndex, build_sids, load_catalogue
from peft_grounded.sids.extended_base import load_base
from peft_grounded.sids.index import JSON_NAME
from peft_grounded.training import sample_rows
from peft_grounded.training.grounding import GroundingTrainer, grounding_dataset
from peft_grounded.training.stage_config import GroundingConfig


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--output_dir", type=Path, default=Path("runs/quickstart"))
    parser.add_argument("--max_steps", type=int, default=10)
    args = parser.parse_args()

    catalogue = load_catalogue("movielens-100k")
    sid_dir = args.output_dir / "sids"
    if (sid_dir / JSON_NAME).is_file():
        index = SIDIndex.load(sid_dir)
    else:
        index = build_sids(
            catalogue, sid_dir, levels=3, codes=64, text_template=["title", "categories", "release_year"]
        )
    print(index.summary())

    model_path = assets.smollm2()
    tokenizer, model = load_base(str(model_path))
    tokens, centroids = index.adapter_init("items")  # one row per SID token, in token order
    new_ids = peft_grounded.add_tokens(tokenizer, model, tokens)  # adds + resizes
    config = peft_grounded.GroundedTokenConfig(
        token_indices=new_ids, init="centroid", init_vectors=centroids, task_type="CAUSAL_LM"
    )
    model = get_peft_model(model, config)
    model.print_trainable_parameters()  # len(new_ids) x 576 (SmolLM2 ties its head)

    data = sample_rows(grounding_dataset(catalogue, index, tokenizer), 16 * args.max_steps, seed=0)
    trainer = GroundingTrainer(
        model,
        GroundingConfig(
            output_dir=str(args.output_dir / "grounding"),
            max_steps=args.max_steps,
            per_device_train_batch_size=8,
            learning_rate=5e-3,
            max_length=128,
            logging_steps=5,
            save_steps=args.max_steps,
        ),
        train_dataset=data,
        processing_class=tokenizer,
    )
    out = args.output_dir
    trainer.train(resume_from_checkpoint=True if (out / "grounding" / "run.json").is_file() else None)
    adapter_dir = out / "grounding" / "adapter"  # adapter_model.safetensors holds only the new rows
    print(
        f"adapter: {adapter_dir} ({(adapter_dir / 'adapter_model.safetensors').stat().st_size / 2**20:.2f} MiB)"
    )

    # In a fresh process: the base model, the same tokens, then PEFT's usual loader (after import peft_grounded).
    tokenizer, base = load_base(str(model_path))
    peft_grounded.add_tokens(tokenizer, base, tokens)
    reloaded = PeftModel.from_pretrained(base, adapter_dir, is_trainable=True)
    item = index.item_ids[0]
    ids = tokenizer(f"{catalogue.items[item].title} is {index.sid_text(item)}", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = reloaded(input_ids=ids).logits
    print(f"reloaded adapter: logits {tuple(logits.shape)} for {index.sid_text(item)!r}")

    peft_grounded.add_lora(reloaded, r=8, lora_alpha=16, target_modules="all-linear")  # for the task's SFT
    reloaded.print_trainable_parameters()

    tokenizer, base = load_base(str(model_path))
    peft_grounded.add_tokens(tokenizer, base, tokens)
    merged = PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
    print(
        f"merged into the base model: {type(merged).__name__} with {merged.get_input_embeddings().weight.shape[0]} rows"
    )

    recommender = peft_grounded.GroundedRecommender.from_pretrained(
        adapter_dir, sid_index=index, catalogue=catalogue
    )
    (user,) = recommender.recommend([["1", "50", "181"]], k=10)  # Toy Story, Star Wars, Return of the Jedi
    print(user.table())


if __name__ == "__main__":
    main()
