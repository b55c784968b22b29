"""The compiled MLP and norms (training.steps.compiled_blocks): the same loss and gradients as eager, still
compiled after ``eval()``/``train()`` of a loaded model (transformers' kernel hub rewrites ``forward`` there), as
before afterwards, the trainer compiling where wants_compile_blocks says, and a clear refusal where no C++
compiler is found."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from conftest import build_tiny_model
from helpers.lora_models import lora_model
from transformers import TrainerCallback

from peft_grounded.training.steps import (
    COMPILE_MIN_STEPS,
    compile_problem,
    compiled_blocks,
    compiled_parts,
    compiler_found,
    wants_compile_blocks,
)

needs_compiler = pytest.mark.skipif(compile_problem() is not None, reason=str(compile_problem()))


def _lora_model(arch: str, tied: bool):
    return lora_model(build_tiny_model(arch, tied))


def _loss_and_grads(model, ids):
    model.zero_grad()
    loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _compiled(part) -> bool:
    return part._compiled_call_impl is not None


@needs_compiler
@pytest.mark.parametrize("arch, tied", [("llama", True), ("qwen3", False)])
def test_compiled_parts_keep_the_loss_and_every_gradient(arch, tied, tmp_path):
    from transformers import AutoModelForCausalLM

    build_tiny_model(arch, tied).save_pretrained(tmp_path)  # loaded, as a run loads its base
    model = lora_model(AutoModelForCausalLM.from_pretrained(tmp_path))
    parts = compiled_parts(model.train())
    assert len(parts) == 3 * len(model.get_base_model().model.layers)
    parts[0].compile()  # compiled by the user: stays so afterwards
    user_call = parts[0]._compiled_call_impl
    ids = torch.randint(3, 500, (2, 24), generator=torch.Generator().manual_seed(0))
    eager, eager_grads = _loss_and_grads(model, ids)
    with compiled_blocks(model, True) as count:
        assert count == len(parts)
        model.eval()
        model.train()  # the trainer flips modes (evaluation callbacks): the parts stay compiled
        assert all(_compiled(part) for part in parts)
        fused, fused_grads = _loss_and_grads(model, ids)
        longer, _ = _loss_and_grads(model, torch.cat([ids, ids], dim=1))  # another length: dynamic shapes
    assert fused == pytest.approx(eager, rel=1e-5)
    assert longer > 0
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert set(fused_grads) == set(eager_grads) == trainable
    for name, grad in eager_grads.items():  # fused kernels sum in another order: float32 rounding only
        torch.testing.assert_close(fused_grads[name], grad, rtol=1e-3, atol=1e-3 * grad.abs().max().item())
    assert parts[0]._compiled_call_impl is user_call
    assert not any(_compiled(part) for part in parts[1:])


def test_off_changes_nothing_and_no_compiler_is_a_clear_error(monkeypatch):
    model = _lora_model("llama", True)
    with compiled_blocks(model, False) as count:
        assert count == 0 and not any(_compiled(p) for p in compiled_parts(model))
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    with (
        pytest.raises(RuntimeError, match=r"C\+\+ compiler.*compile_blocks=False"),
        compiled_blocks(model, True),
    ):
        pass
    assert not any(_compiled(p) for p in compiled_parts(model))
    if compiler_found():
        monkeypatch.delenv("CXX")
        monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
        monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
        with (
            pytest.raises(RuntimeError, match=r"ATEN_CPU_CAPABILITY.*TORCHINDUCTOR_CACHE_DIR"),
            compiled_blocks(model, True),
        ):
            pass


def _args(**overrides):
    settings = {"compile_blocks": None, "bf16": True, "max_steps": COMPILE_MIN_STEPS} | overrides
    return SimpleNamespace(**settings)


def test_auto_compiles_long_bf16_runs_on_a_cpu_with_a_compiler(monkeypatch):
    runs = compile_problem() is None
    assert wants_compile_blocks(_args(), "cpu") is runs
    assert wants_compile_blocks(_args(max_steps=-1), "cpu") is runs  # a time budget
    assert not wants_compile_blocks(_args(max_steps=COMPILE_MIN_STEPS - 1), "cpu")
    assert not wants_compile_blocks(_args(bf16=False), "cpu")
    assert not wants_compile_blocks(_args(), "cuda")
    assert wants_compile_blocks(_args(compile_blocks=True, bf16=False, max_steps=2), "cuda")
    assert not wants_compile_blocks(_args(compile_blocks=False), "cpu")
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    assert not wants_compile_blocks(_args(), "cpu")
    monkeypatch.delenv("CXX")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv(
        "ATEN_CPU_CAPABILITY", "avx2"
    )  # kernels held to another ISA: inductor's cache mixes them
    assert not wants_compile_blocks(_args(), "cpu")


class _Compiled(TrainerCallback):
    def __init__(self) -> None:
        self.seen: list[bool] = []

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.seen.append(all(_compiled(p) for p in compiled_parts(model)))


@needs_compiler
def test_the_trainer_compiles_when_asked_and_restores_the_eager_forward(tokenizer, tmp_path):
    from helpers.sid_training import sid_training, trainer_args

    from peft_grounded.training.sft import RecommendationTrainer

    losses = {}
    for compile_blocks in (False, True):
        run = sid_training(tokenizer)
        seen = _Compiled()
        args = trainer_args(tmp_path / str(compile_blocks), compile_blocks=compile_blocks)
        trainer = RecommendationTrainer(
            run.model, args, train_dataset=run.data, processing_class=run.tokenizer, callbacks=[seen]
        )
        trainer.train()
        assert seen.seen == [compile_blocks] * 3
        assert not any(_compiled(p) for p in compiled_parts(run.model))
        losses[compile_blocks] = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    assert losses[True] == pytest.approx(losses[False], rel=1e-4)
