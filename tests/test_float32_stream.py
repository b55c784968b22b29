"""float32_stream (training.steps.float32_stream): under bf16 the residual stream and the SID head in float32,
closer to a float32 model than the bf16 stream, gone afterwards, and entered by the trainer when asked."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import build_tiny_model
from transformers import TrainerCallback

from peft_grounded.sid_head import compact_fused_forward
from peft_grounded.training.steps import float32_stream


def _hidden(model, ids: torch.Tensor) -> torch.Tensor:
    return model.model(ids).last_hidden_state


@pytest.mark.parametrize("arch, tied", [("llama", True), ("qwen3", False)])
def test_the_stream_is_float32_inside_closer_to_float32_and_bf16_afterwards(arch, tied):
    model = build_tiny_model(arch, tied).to(torch.bfloat16)
    reference = copy.deepcopy(model).float()  # the same (rounded) weights, all in float32
    ids = torch.randint(3, 500, (2, 24), generator=torch.Generator().manual_seed(0))
    embeddings = model.get_input_embeddings()
    hooks = dict(embeddings._forward_hooks)
    with torch.no_grad():
        target = _hidden(reference, ids)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            plain = _hidden(model, ids)
            with float32_stream(model, True) as on:
                stream = _hidden(model, ids)
            with float32_stream(model, False) as off:
                assert _hidden(model, ids).dtype == torch.bfloat16
            after = _hidden(model, ids)
    assert on and not off
    assert plain.dtype == after.dtype == torch.bfloat16 and stream.dtype == torch.float32
    assert dict(embeddings._forward_hooks) == hooks
    torch.testing.assert_close(after, plain, rtol=0, atol=0)

    def error(hidden: torch.Tensor) -> float:
        return float((hidden.float() - target).norm() / target.norm())

    assert error(stream) < 0.8 * error(plain)  # measured 0.5-0.7x on both architectures, three seeds


def test_the_sid_head_scores_in_the_hidden_states_dtype():
    model = build_tiny_model("llama", True).to(torch.bfloat16)
    ids = torch.randint(3, 500, (2, 16), generator=torch.Generator().manual_seed(1))
    sid_ids = torch.arange(400, 464)
    labels = torch.full_like(ids, -100)
    labels[:, 8:] = torch.randint(400, 464, (2, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), float32_stream(model, True):
        out = compact_fused_forward(model, input_ids=ids, labels=labels, sid_ids=sid_ids)
        hidden = _hidden(model, ids)[:, :-1]
    mask = labels[:, 1:] != -100
    weight = model.get_output_embeddings().weight[sid_ids].float()
    log_probs = (hidden[mask] @ weight.T).log_softmax(-1)  # float32 throughout
    expected = log_probs.gather(1, (labels[:, 1:][mask] - 400).unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(out.log_probs[mask], expected, rtol=1e-5, atol=1e-5)
    rounded = (hidden[mask].bfloat16() @ weight.bfloat16().T).float().log_softmax(-1)
    assert not torch.allclose(rounded, log_probs, atol=1e-4)  # a bf16 head would not pass the check above


def test_the_trainer_streams_in_float32_when_asked_and_trains_only_the_adapters(tokenizer, tmp_path):
    from helpers.sid_training import sid_training, trainer_args

    from peft_grounded.training.sft import RecommendationTrainer

    class StreamDtype(TrainerCallback):
        def __init__(self, block: torch.nn.Module) -> None:
            self.seen: list[torch.dtype] = []
            block.register_forward_pre_hook(lambda module, args: self.seen.append(args[0].dtype))

    seen = {}
    for on in (False, True):
        run = sid_training(tokenizer, lora_rank=4, dtype=torch.bfloat16)
        model = run.model
        frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
        trainable = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        watch = StreamDtype(model.get_base_model().model.layers[0])
        args = trainer_args(
            tmp_path / str(on), max_steps=2, bf16=True, float32_stream=on, compile_blocks=False
        )
        trainer = RecommendationTrainer(
            model, args, train_dataset=run.data, processing_class=run.tokenizer, callbacks=[watch]
        )
        trainer.train()
        seen[on] = set(watch.seen)
        assert all(r["loss"] == r["loss"] for r in trainer.state.log_history if "loss" in r)  # no NaN
        for name, weight in model.named_parameters():
            if name in frozen:
                torch.testing.assert_close(weight, frozen[name], rtol=0, atol=0)
            else:
                assert not torch.equal(weight, trainable[name]), f"{name} did not train"
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):  # afterwards: as before
            model.get_base_model().model(torch.tensor([[5, 6, 7]]))
        assert watch.seen[-1] == torch.bfloat16
    assert seen == {False: {torch.bfloat16}, True: {torch.float32}}
