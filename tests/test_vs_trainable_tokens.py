"""GroundedTokenConfig against PEFT's own TrainableTokensConfig / LoraConfig(trainable_token_indices).

Given the same starting rows for the same new tokens, both compute the same logits and the same gradients
for those rows (tied and untied heads, with and without a LoRA). The differences docs/vs_trainable_tokens.md
lists are checked here against the PEFT version the project pins, so the page is updated when PEFT changes.
"""

from __future__ import annotations

import copy

import pytest
import torch
from peft import LoraConfig, PeftModel, TrainableTokensConfig, get_peft_model

from peft_grounded import GroundedTokenConfig, add_lora

VOCAB = 1000
NEW = list(range(VOCAB, VOCAB + 12))
INPUT = torch.tensor([[5, NEW[0], 7, NEW[3], NEW[11], 3, NEW[3]]])


def resized(factory, tied: bool) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """A tiny Llama with 12 new tokens whose input (and untied output) rows are set to seeded random rows."""
    model = factory("llama", tied=tied, vocab_size=VOCAB)
    model.resize_token_embeddings(VOCAB + len(NEW), mean_resizing=False)
    generator = torch.Generator().manual_seed(1)
    rows_in = 0.02 * torch.randn(len(NEW), 64, generator=generator)
    rows_out = 0.02 * torch.randn(len(NEW), 64, generator=generator)
    with torch.no_grad():
        model.get_input_embeddings().weight[NEW] = rows_in
        if not tied:
            model.get_output_embeddings().weight[NEW] = rows_out
    return model, rows_in, rows_out


def grounded(model, rows_in, rows_out, tied: bool):
    """The grounded adapter started from exactly the rows PEFT's TrainableTokens copies from the model."""
    vectors = rows_in if tied else {"input": rows_in, "output": rows_out}
    config = GroundedTokenConfig(
        token_indices=NEW, init="tensor", init_vectors=vectors, original_vocab_size=VOCAB
    )
    return get_peft_model(copy.deepcopy(model), config)


def logits_and_loss(model) -> torch.Tensor:
    out = model(input_ids=INPUT, labels=INPUT)
    out.loss.backward()
    return out.logits.detach()


def trainable(model, marker: str) -> dict[str, torch.Tensor]:
    """Trainable parameters whose name holds ``marker``, by the module they sit on (embed_tokens / lm_head)."""
    return {
        ("lm_head" if "lm_head" in name or "grounded_head" in name else "embed_tokens"): p
        for name, p in model.named_parameters()
        if p.requires_grad and marker in name
    }


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_same_rows_give_the_same_logits_and_row_gradients(tiny_model_factory, tied):
    model, rows_in, rows_out = resized(tiny_model_factory, tied)
    ours = grounded(model, rows_in, rows_out, tied)
    # PEFT trains an untied head's rows only when the head is targeted too
    targets = None if tied else ["embed_tokens", "lm_head"]
    peft = get_peft_model(
        copy.deepcopy(model), TrainableTokensConfig(token_indices=NEW, target_modules=targets)
    )

    torch.testing.assert_close(logits_and_loss(ours), logits_and_loss(peft), rtol=0, atol=1e-5)
    ours_rows, peft_rows = trainable(ours, "grounded_"), trainable(peft, "trainable_tokens_delta")
    assert (
        sorted(ours_rows) == sorted(peft_rows) == (["embed_tokens"] if tied else ["embed_tokens", "lm_head"])
    )
    for module, rows in ours_rows.items():
        assert rows.grad is not None and rows.grad.abs().sum() > 0
        torch.testing.assert_close(rows.grad, peft_rows[module].grad, rtol=1e-5, atol=1e-7)


def test_with_a_lora_the_same_as_trainable_token_indices(tiny_model_factory):
    model, rows_in, rows_out = resized(tiny_model_factory, tied=True)
    ours = grounded(model, rows_in, rows_out, tied=True)
    torch.manual_seed(3)  # the same LoRA A matrices: both create them in module order
    add_lora(ours, r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    torch.manual_seed(3)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], trainable_token_indices=NEW)
    peft = get_peft_model(copy.deepcopy(model), lora)

    torch.testing.assert_close(logits_and_loss(ours), logits_and_loss(peft), rtol=0, atol=1e-5)
    torch.testing.assert_close(
        trainable(ours, "grounded_")["embed_tokens"].grad,
        trainable(peft, "trainable_tokens_delta")["embed_tokens"].grad,
        rtol=1e-5,
        atol=1e-7,
    )
    ours_b = {n: p.grad for n, p in ours.named_parameters() if "lora_B" in n}
    peft_b = {n: p.grad for n, p in peft.named_parameters() if "lora_B" in n}
    assert list(ours_b) == list(peft_b) and len(ours_b) == 4
    for name, grad in ours_b.items():
        assert grad.abs().sum() > 0
        torch.testing.assert_close(grad, peft_b[name], rtol=1e-5, atol=1e-7)


def test_files_and_base_checks_differ(tiny_model_factory, tmp_path):
    """Rows-only file and the base-model check (grounded) against PEFT's file and its silent load."""
    for seed, name in ((0, "base"), (1, "other")):
        tiny_model_factory("llama", vocab_size=VOCAB, seed=seed).save_pretrained(tmp_path / name)

    def base(name):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(tmp_path / name)
        model.resize_token_embeddings(VOCAB + len(NEW), mean_resizing=False)
        return model

    rows_bytes = len(NEW) * 64 * 4
    configs = {
        "grounded": GroundedTokenConfig(token_indices=NEW, init="mean", original_vocab_size=VOCAB),
        "trainable_tokens": TrainableTokensConfig(token_indices=NEW),
    }
    sizes = {}
    for label, config in configs.items():
        get_peft_model(base("base"), config).save_pretrained(tmp_path / label)  # save_embedding_layers="auto"
        sizes[label] = (tmp_path / label / "adapter_model.safetensors").stat().st_size
    assert sizes["grounded"] < rows_bytes + 1024  # the new rows and a header
    assert sizes["trainable_tokens"] > (VOCAB + len(NEW)) * 64 * 4  # the whole resized embedding too

    PeftModel.from_pretrained(base("other"), tmp_path / "trainable_tokens")  # another base: no check
    with pytest.raises(ValueError, match="embedding signature"):
        PeftModel.from_pretrained(base("other"), tmp_path / "grounded")


def untied_bart():
    """A tiny BART whose head is untied; its encoder and decoder embed through the `shared` weight."""
    from transformers import BartConfig, BartForConditionalGeneration

    config = BartConfig(
        vocab_size=VOCAB,
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=32,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = BartForConditionalGeneration(config).eval()
    model.resize_token_embeddings(VOCAB + len(NEW), mean_resizing=False)
    assert model.model.encoder.embed_tokens.weight is model.model.shared.weight
    return model


def test_untied_seq2seq_rows_reach_the_encoder_and_merge_exactly():
    """PEFT wraps only `shared` of an untied BART: its rows get no gradient and merging changes the outputs."""
    model = untied_bart()
    source, target = torch.tensor([[5, NEW[0], NEW[3], 2]]), torch.tensor([[NEW[5], 7, 2]])
    configs = {
        "grounded": GroundedTokenConfig(
            token_indices=NEW, init="random", original_vocab_size=VOCAB, task_type="SEQ_2_SEQ_LM"
        ),
        "trainable_tokens": TrainableTokensConfig(token_indices=NEW),
    }
    merge_error, learns = {}, {}
    for label, config in configs.items():
        adapted = get_peft_model(copy.deepcopy(model), config)
        learns[label] = adapted(input_ids=source, labels=target).loss.requires_grad
        with torch.no_grad():  # stand-in for training: move every trainable row
            for p in adapted.parameters():
                if p.requires_grad:
                    p.add_(0.5 * torch.randn_like(p))
            trained = adapted(input_ids=source, labels=target).logits
            merged = adapted.merge_and_unload()(input_ids=source, labels=target).logits
        merge_error[label] = (trained - merged).abs().max().item()
    assert learns == {"grounded": True, "trainable_tokens": False}
    assert merge_error["grounded"] == 0.0
    assert merge_error["trainable_tokens"] > 1e-2


def test_trl_fused_head_reads_the_grounded_rows_not_peft_wrapper(tiny_model_factory):
    """TRL 1.16's fused loss (what SFTTrainer computes) reads lm_head.weight and lm_head.bias of a tied head."""
    from trl.trainer.utils import add_fused_lm_head

    model, rows_in, _ = resized(tiny_model_factory, tied=True)
    bases = [copy.deepcopy(model), copy.deepcopy(model)]
    for base in bases:  # patched after copying: the patch keeps a reference to the model's own forward
        add_fused_lm_head(base)
    config = GroundedTokenConfig(
        token_indices=NEW, init="tensor", init_vectors=rows_in, original_vocab_size=VOCAB
    )
    ours = get_peft_model(bases[0], config)
    peft = get_peft_model(bases[1], LoraConfig(r=4, target_modules=["q_proj"], trainable_token_indices=NEW))
    for adapted in (ours, peft):
        with torch.no_grad():  # trained rows: away from the base's, so a stale head would show
            for name, p in adapted.named_parameters():
                if p.requires_grad and "lora" not in name:
                    p.add_(1.0)

    fused = ours(input_ids=INPUT, labels=INPUT, fused_lm_head=True).log_probs[0]
    logits = ours(input_ids=INPUT).logits[0, :-1]
    own = torch.log_softmax(logits, -1).gather(-1, INPUT[0, 1:, None]).squeeze(-1)
    torch.testing.assert_close(fused, own, rtol=1e-5, atol=1e-4)
    with pytest.raises(AttributeError, match="bias"):
        peft(input_ids=INPUT, labels=INPUT, fused_lm_head=True)
