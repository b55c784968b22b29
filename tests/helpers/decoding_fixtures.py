"""A tiny SID catalogue for the decoding tests: SID tokens added to a tiny model, items as token-id lists, chat
prompts, and the exhaustive scores constrained beam search must match."""

from __future__ import annotations

import itertools
import random

import torch

from peft_grounded.decoding import sid_token_ids

LEVELS = "abc"
CODES = 4
N_ITEMS = 30
QUESTIONS = [
    "I watched <a_1><b_2><c_3> then <a_0><b_0><c_1>. What next?",
    "Recommend something.",
    "After a long list of films, among them <a_3><b_1><c_0>, <a_2><b_2><c_2> and <a_1><b_3><c_3>, what would I like?",
]


def add_sid_tokens(tokenizer, model, scale: float | None = 1.0, seed: int = 0) -> list[int]:
    """Add all level x code tokens; give their rows random values (``scale``) so that items rank clearly."""
    tokens = [f"<{level}_{code}>" for level in LEVELS for code in range(CODES)]
    tokenizer.add_tokens(tokens)
    if model.get_input_embeddings().weight.shape[0] < len(tokenizer):
        model.resize_token_embeddings(len(tokenizer))
    ids = tokenizer.convert_tokens_to_ids(tokens)
    if scale is not None:
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for weight in {model.get_input_embeddings().weight, model.get_output_embeddings().weight}:
                weight[ids] = scale * torch.randn(len(ids), weight.shape[1], generator=generator)
    return ids


def make_catalogue(tokenizer, n_items: int = N_ITEMS, seed: int = 0) -> dict[str, list[int]]:
    """``n_items`` random 3-level SIDs, many sharing prefixes (64 possible SIDs)."""
    codes = random.Random(seed).sample(list(itertools.product(range(CODES), repeat=len(LEVELS))), n_items)
    texts = {
        f"item{i}": "".join(f"<{lv}_{c}>" for lv, c in zip(LEVELS, cs, strict=True))
        for i, cs in enumerate(codes)
    }
    return sid_token_ids(tokenizer, texts)


def chat_prompts(tokenizer, questions=QUESTIONS) -> list[str]:
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
        )
        for q in questions
    ]


@torch.no_grad()
def exhaustive_scores(model, prompt_ids: list[int], catalogue: dict[str, list[int]]) -> dict[str, float]:
    """Teacher-forced log P(SID | prompt) of every item, summed over the SID tokens (no padding on the left)."""
    items = list(catalogue)
    width = len(prompt_ids) + max(len(s) for s in catalogue.values())
    input_ids = torch.zeros(len(items), width, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    for row, item in enumerate(items):
        seq = prompt_ids + catalogue[item]
        input_ids[row, : len(seq)] = torch.tensor(seq)
        attention[row, : len(seq)] = 1
    keep = width - len(prompt_ids) + 1  # logits from the last prompt position on
    logits = model(input_ids=input_ids, attention_mask=attention, logits_to_keep=keep).logits
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    start = 0
    return {
        item: sum(float(log_probs[row, start + j, token]) for j, token in enumerate(catalogue[item]))
        for row, item in enumerate(items)
    }
