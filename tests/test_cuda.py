"""The CUDA paths against the CPU's (``pytest -m cuda``; every test skips without a GPU).

Run by ``benchmarks/gpu/run.sh`` on the lent GPU machine. Tiny Llama / Qwen3 models from configs (see
conftest), so each test takes seconds; the reference is always the same computation on the CPU in fp32.
"""

from __future__ import annotations

import copy
import os

import numpy as np
import pytest
import torch

import peft_grounded
from peft_grounded import GroundedTokenConfig
from peft_grounded.sid_head import compact_head

# PEFT_GROUNDED_TEST_DEVICE=cpu runs the same tests CPU against CPU: a check of the tests themselves
DEVICE = os.environ.get("PEFT_GROUNDED_TEST_DEVICE", "cuda")
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        DEVICE.startswith("cuda") and not torch.cuda.is_available(), reason="needs a CUDA device"
    ),
]

CASES = [("llama", True), ("llama", False), ("qwen3", True), ("qwen3", False)]
# tolerance of a low-precision CUDA run against the CPU's fp32 (relative to the gradient's scale)
TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 6e-2, torch.float16: 2e-2}


def wrapped(tokenizer, factory, arch: str, tied: bool, task_type: str | None = None):
    from peft import get_peft_model

    base = factory(arch, tied, extra_rows=64 if arch == "qwen3" else 0)
    new = peft_grounded.add_sid_tokens(tokenizer, base, [8, 8])
    config = GroundedTokenConfig(token_indices=new, init="gaussian", task_type=task_type)
    return get_peft_model(base, config), new


def batch(new: list[int], device: str = "cpu") -> dict:
    ids = torch.tensor(
        [[1, 17, new[0], new[-1], 400, new[3], 9, new[6]], [5, new[1], 300, 301, new[-2], 7, 8, 2]]
    )
    return {"input_ids": ids.to(device), "labels": ids.clone().to(device)}


def row_grads(model) -> dict[str, torch.Tensor]:
    layer = model.get_input_embeddings()
    grads = {"input": layer.grounded_embedding["default"].grad}
    if "default" in layer.grounded_head:
        grads["output"] = layer.grounded_head["default"].grad
    return {k: v.detach().float().cpu() for k, v in grads.items()}


def assert_close_scaled(actual: torch.Tensor, expected: torch.Tensor, tol: float) -> None:
    """``|actual - expected| <= tol * max|expected|``: low-precision errors scale with the values."""
    scale = expected.abs().max().clamp(min=1e-12)
    error = (actual - expected).abs().max()
    assert error <= tol * scale, f"max error {float(error):.3g} > {tol} x {float(scale):.3g}"


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"]
)
@pytest.mark.parametrize(("arch", "tied"), CASES)
def test_forward_backward_on_cuda_matches_cpu(tokenizer, tiny_model_factory, arch, tied, dtype):
    model, new = wrapped(tokenizer, tiny_model_factory, arch, tied)
    gpu = copy.deepcopy(model).to(DEVICE, dtype)
    cpu_loss = model(**batch(new)).loss
    cpu_loss.backward()
    gpu_loss = gpu(**batch(new, DEVICE)).loss
    gpu_loss.backward()
    tol = TOLERANCE[dtype]
    cpu_value, gpu_value = float(cpu_loss.detach()), float(gpu_loss.detach())
    assert abs(gpu_value - cpu_value) <= tol * abs(cpu_value)
    expected, actual = row_grads(model), row_grads(gpu)
    assert expected.keys() == actual.keys() == ({"input"} | (set() if tied else {"output"}))
    for key in expected:
        assert torch.isfinite(actual[key]).all()
        assert_close_scaled(actual[key], expected[key], tol)
    # the rows themselves: the same values on both devices (cast only)
    # (rows kept as float32 master weights on a half-precision base, or cast with it: either way the same)
    cpu_rows = model.get_input_embeddings().grounded_embedding["default"]
    gpu_rows = gpu.get_input_embeddings().grounded_embedding["default"]
    torch.testing.assert_close(gpu_rows.float().cpu(), cpu_rows.to(gpu_rows.dtype).float())


@pytest.mark.parametrize(("arch", "tied"), [("llama", False), ("qwen3", True)])
def test_compact_head_equals_trl_fused_head_on_cuda(tokenizer, tiny_model_factory, arch, tied):
    """On CUDA TRL's fused head already skips unlabelled positions; the compact path must agree with it."""
    pytest.importorskip("trl")
    from trl.trainer.utils import add_fused_lm_head

    model, new = wrapped(tokenizer, tiny_model_factory, arch, tied, task_type="CAUSAL_LM")
    model.to(DEVICE)
    add_fused_lm_head(model.get_base_model(), outputs=("log_probs", "entropy", "is_top1"))
    inputs = batch(new, DEVICE)
    inputs["labels"][:, :4] = -100
    full = model(**inputs, fused_lm_head=True)
    full.loss.backward()
    expected = {k: v.clone() for k, v in row_grads(model).items()}
    model.zero_grad()
    with compact_head(model):
        compact = model(**inputs, fused_lm_head=True)
    compact.loss.backward()
    assert compact.log_probs.device.type == torch.device(DEVICE).type
    torch.testing.assert_close(compact.log_probs, full.log_probs, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(compact.loss, full.loss, rtol=1e-4, atol=1e-5)
    assert torch.equal(compact.label_mask, full.label_mask)
    for key, grad in row_grads(model).items():
        torch.testing.assert_close(grad, expected[key], rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize(("arch", "tied"), [("llama", False), ("qwen3", True)])
def test_sid_only_softmax_on_cuda_matches_cpu(tokenizer, tiny_model_factory, arch, tied):
    """The SID-only softmax (SID rows read from the head and the adapter) on CUDA against the CPU, and its
    decoding head: the same logits over the SID rows."""
    pytest.importorskip("trl")
    from trl.trainer.utils import add_fused_lm_head

    from peft_grounded.decoding.heads import StepHead

    model, new = wrapped(tokenizer, tiny_model_factory, arch, tied, task_type="CAUSAL_LM")
    gpu = copy.deepcopy(model).to(DEVICE)
    results = []
    for m, device in ((model, "cpu"), (gpu, DEVICE)):
        add_fused_lm_head(m.get_base_model(), outputs=("log_probs", "entropy", "is_top1"))
        with compact_head(m, sid_ids=m.base_model.grounded_token_ids()):
            out = m(**batch(new, device), fused_lm_head=True)
        out.loss.backward()
        logits, _ = StepHead(m, m.base_model.grounded_token_ids())(
            m, 2, input_ids=batch(new, device)["input_ids"]
        )
        results.append((out.loss.detach().cpu(), row_grads(m), logits.cpu()))
    (cpu_loss, cpu_grads, cpu_logits), (gpu_loss, gpu_grads, gpu_logits) = results
    torch.testing.assert_close(gpu_loss, cpu_loss, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gpu_logits, cpu_logits, rtol=1e-3, atol=1e-4)
    for key, grad in cpu_grads.items():
        assert_close_scaled(gpu_grads[key], grad, TOLERANCE[torch.float32])


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_trains_inside_trl_sft_trainer_on_cuda(tokenizer, tiny_model_factory, tmp_path, tied, precision):
    pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    from trl import SFTConfig, SFTTrainer

    if precision == "fp16" and DEVICE == "cpu":
        pytest.skip("Trainer's fp16 needs a GPU")

    model, _ = wrapped(tokenizer, tiny_model_factory, "llama", tied, task_type="CAUSAL_LM")
    base = model.get_base_model()
    frozen = {k: v.clone() for k, v in base.state_dict().items() if ".grounded_" not in k}
    layer = model.get_input_embeddings()
    rows = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    data = datasets.Dataset.from_list(
        [
            {
                "prompt": [{"role": "user", "content": f"Which item is called thing number {i}?"}],
                "completion": [{"role": "assistant", "content": f"<a_{i % 8}><b_{(3 * i) % 8}>"}],
            }
            for i in range(12)
        ]
    )
    args = SFTConfig(
        output_dir=str(tmp_path),
        max_steps=3,
        per_device_train_batch_size=4,
        learning_rate=5e-2,
        report_to=[],
        save_strategy="no",
        max_length=64,
        logging_steps=1,
        disable_tqdm=True,
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        use_cpu=DEVICE == "cpu",
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
    trainer.train()
    assert layer.grounded_embedding["default"].device.type == torch.device(DEVICE).type
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert losses and all(np.isfinite(losses))
    for name, param in model.named_parameters():
        if param.requires_grad:
            assert torch.isfinite(param).all(), name
            assert not torch.equal(param.detach().cpu(), rows[name].cpu()), f"{name} did not train"
    after = base.state_dict()
    assert all(torch.equal(frozen[k].cpu(), after[k].cpu()) for k in frozen)


def test_save_on_cuda_load_on_cpu_bit_identical(tokenizer, tiny_model_factory, tmp_path):
    from peft import PeftModel

    model, new = wrapped(tokenizer, tiny_model_factory, "qwen3", False)
    model.to(DEVICE)
    with torch.no_grad():  # rows that exist only on the GPU
        for rows in (
            model.get_input_embeddings().grounded_embedding,
            model.get_input_embeddings().grounded_head,
        ):
            rows["default"].add_(torch.randn_like(rows["default"]))
    model.save_pretrained(tmp_path / "adapter")
    gpu_rows = {n: p.detach().cpu() for n, p in model.named_parameters() if ".grounded_" in n}
    fresh = tiny_model_factory("qwen3", False, extra_rows=64)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    assert peft_grounded.add_sid_tokens(tok, fresh, [8, 8]) == new
    loaded = PeftModel.from_pretrained(fresh, tmp_path / "adapter")
    cpu_rows = {n: p.detach() for n, p in loaded.named_parameters() if ".grounded_" in n}
    assert cpu_rows.keys() == gpu_rows.keys() and cpu_rows
    for name in gpu_rows:
        assert cpu_rows[name].device.type == "cpu"
        assert torch.equal(cpu_rows[name], gpu_rows[name]), name


@pytest.mark.parametrize(("arch", "tied"), [("llama", True), ("qwen3", False)])
def test_constrained_beam_search_on_cuda_gives_the_cpu_ranking(tokenizer, tiny_model_factory, arch, tied):
    from helpers.decoding_fixtures import N_ITEMS, add_sid_tokens, chat_prompts, make_catalogue

    from peft_grounded.decoding import recommend

    model = tiny_model_factory(arch=arch, tied=tied, extra_rows=64 if arch == "qwen3" else 0)
    add_sid_tokens(tokenizer, model)
    catalogue = make_catalogue(tokenizer)
    prompts = chat_prompts(tokenizer)
    cpu = recommend(model, tokenizer, prompts, catalogue, k=10, num_beams=N_ITEMS + 4, batch_size=3)
    gpu = recommend(
        model.to(DEVICE), tokenizer, prompts, catalogue, k=10, num_beams=N_ITEMS + 4, batch_size=3
    )
    assert gpu.items == cpu.items
    torch.testing.assert_close(gpu.scores, cpu.scores, atol=1e-3, rtol=1e-4)
    assert gpu.num_invalid == 0


def test_rqkmeans_on_cuda_codes_as_good_as_cpu():
    from helpers.sids_fixtures import clustered_vectors, purity

    from peft_grounded.sids.quantizers import RQKMeansConfig, fit_rqkmeans

    x, cluster, offset = clustered_vectors(n_clusters=16, sub=4, per_sub=24, dim=64)
    fits = {
        device: fit_rqkmeans(x, RQKMeansConfig(codes_per_level=(16, 4, 8), seed=0, device=device))
        for device in ("cpu", DEVICE)
    }
    for fit in fits.values():
        codes = fit.codes.cpu().numpy()
        assert purity(codes[:, 0], cluster) >= 0.99 and purity(codes[:, 1], offset) >= 0.95
    cpu, gpu = fits["cpu"], fits[DEVICE]
    assert gpu.level_mse[-1] <= 1.05 * cpu.level_mse[-1] + 1e-6
    collisions = {d: len(x) - len({tuple(c) for c in f.codes.cpu().tolist()}) for d, f in fits.items()}
    assert collisions[DEVICE] <= collisions["cpu"] + len(x) // 100


def _recommendation_step(tokenizer, tiny_model_factory, tmp_path, objective: str) -> None:
    """One SFT run of a few steps on CUDA through the package's RecommendationTrainer."""
    from helpers.toy_catalogue import toy_catalogue, toy_index

    from peft_grounded.pipeline import Budget, Experiment, run_strategy
    from peft_grounded.prompts import PromptFormat

    path = tmp_path / "base"
    tiny_model_factory("llama", True).save_pretrained(path)
    tokenizer.save_pretrained(path)
    catalogue = toy_catalogue()
    fmt = PromptFormat(objective=objective, max_history=4)
    experiment = Experiment(str(path), catalogue, toy_index(catalogue), fmt=fmt)
    from peft_grounded.evaluation import EvalSettings

    budget = Budget.from_training(
        dict(per_device_train_batch_size=4, save_steps=10, logging_steps=1, disable_tqdm=True, bf16=True),
        grounding=dict(max_steps=2),
        sft=dict(max_steps=3),
        lora=dict(r=2),
        evaluation=EvalSettings(users=4, num_beams=8, ks=(1, 5), bf16=True),
    )
    record = run_strategy("centroid_gti", experiment, budget, tmp_path / "run")
    assert record["metrics"]["test"]["decoding"]["invalid"] == 0
    assert np.isfinite(record["likelihood"]["test"]["all"]["constrained_nll"])


def test_prompt_objective_training_step_on_cuda(tokenizer, tiny_model_factory, tmp_path):
    pytest.importorskip("trl")
    _recommendation_step(tokenizer, tiny_model_factory, tmp_path, "prompt")


def test_sequence_objective_training_step_on_cuda(tokenizer, tiny_model_factory, tmp_path):
    pytest.importorskip("trl")
    _recommendation_step(tokenizer, tiny_model_factory, tmp_path, "sequence")
