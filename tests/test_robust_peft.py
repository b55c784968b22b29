"""PEFT's conventions a PEFT user checks: the wrapped model pickles and ``torch.save``\\ s, a fullgraph
``torch.compile`` traces its forward, ``autocast_adapter_dtype`` means for the rows what it means for a LoRA,
and the two TRL/PEFT limitations (docs/peft_trl_limitations.md) behave as documented, with their workarounds."""

from __future__ import annotations

import io
import pickle
import subprocess
import sys
import warnings

import pytest
import torch
from conftest import build_tiny_model
from helpers.robust_faults import fresh_tokenizer
from helpers.toy_catalogue import toy_catalogue, toy_index
from peft import PeftModel, get_peft_model

import peft_grounded
from peft_grounded import GroundedTokenConfig, add_lora
from peft_grounded.training import upcast_trainable

TOKENS = [f"<t_{i}>" for i in range(6)]


def wrapped(tied: bool = False, dtype: torch.dtype = torch.float32, lora: bool = False, **kwargs):
    """A tiny model with six new tokens under a grounded adapter (optionally a LoRA stacked on it)."""
    tokenizer = fresh_tokenizer()
    model = build_tiny_model("llama", tied, dtype=dtype)
    new = peft_grounded.add_tokens(tokenizer, model, TOKENS)
    peft_model = get_peft_model(
        model, GroundedTokenConfig(token_indices=new, task_type="CAUSAL_LM"), **kwargs
    )
    if lora:
        add_lora(peft_model, r=2, target_modules=["q_proj", "v_proj"])
    return peft_model, list(new)


def batch(new: list[int]) -> torch.Tensor:
    return torch.tensor([[1, 17, new[0], 300, new[4], new[5]]])


# --- pickling and torch.save --------------------------------------------------------------------------


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("lora", [False, True], ids=["rows", "rows+lora"])
def test_the_wrapped_model_pickles_and_keeps_its_outputs_and_its_resize_guard(tied, lora):
    model, new = wrapped(tied, lora=lora)
    with torch.no_grad():
        model.get_input_embeddings().grounded_embedding["default"].add_(0.5)  # rows that differ from the base
        expected = model(input_ids=batch(new)).logits
    copy = pickle.loads(pickle.dumps(model))  # the test's own bytes, to check the round trip
    with torch.no_grad():
        torch.testing.assert_close(copy(input_ids=batch(new)).logits, expected)
    with pytest.raises(RuntimeError, match="resizing its embeddings now would misplace"):
        copy.base_model.model.resize_token_embeddings(len(new) + 49152 + 8)


def test_torch_save_of_the_whole_model_works():
    model, _ = wrapped(False, lora=True)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    assert buffer.tell() > 1_000_000  # the whole model went through pickle (tiny base: a few MB)


# --- torch.compile ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tied", "backend"),
    [(True, "eager"), (False, "eager"), pytest.param(False, "aot_eager", marks=pytest.mark.slow)],
    ids=["tied", "untied", "aot"],
)
def test_fullgraph_compile_traces_the_forward_without_graph_breaks(tied, backend):
    model, new = wrapped(tied)
    model.eval()
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend=backend)  # a graph break raises here
    with torch.no_grad():
        torch.testing.assert_close(compiled(input_ids=batch(new)).logits, model(input_ids=batch(new)).logits)


# --- autocast_adapter_dtype ---------------------------------------------------------------------------


def adapter_dtypes(model) -> dict[str, set[torch.dtype]]:
    found: dict[str, set[torch.dtype]] = {"rows": set(), "lora": set()}
    for name, param in model.named_parameters():
        if param.requires_grad:
            found["rows" if ".grounded_" in name else "lora"].add(param.dtype)
    return found


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("autocast", [True, False], ids=["autocast", "no-autocast"])
def test_rows_and_a_stacked_lora_follow_autocast_adapter_dtype_alike(dtype, autocast):
    model, _ = wrapped(False, dtype=dtype, lora=True, autocast_adapter_dtype=autocast)
    expected = torch.float32 if autocast else dtype  # PEFT's rule: upcast half precision, or keep the base's
    assert adapter_dtypes(model) == {"rows": {expected}, "lora": {expected}}


def test_autocast_adapter_dtype_false_holds_on_reload_and_in_the_trainer(tmp_path):
    model, _ = wrapped(False, dtype=torch.bfloat16)
    model.save_pretrained(tmp_path / "adapter")
    for autocast, expected in ((False, torch.bfloat16), (True, torch.float32)):
        base = build_tiny_model("llama", False, dtype=torch.bfloat16)
        peft_grounded.add_tokens(fresh_tokenizer(), base, TOKENS)
        loaded = PeftModel.from_pretrained(
            base, tmp_path / "adapter", is_trainable=True, autocast_adapter_dtype=autocast
        )
        assert adapter_dtypes(loaded)["rows"] == {expected}
        add_lora(loaded, r=2, target_modules=["q_proj"])
        assert adapter_dtypes(loaded)["lora"] == {expected}
        assert upcast_trainable(loaded) == []  # what every trainer does first: bf16 stays bf16 when asked
        assert adapter_dtypes(loaded) == {"rows": {expected}, "lora": {expected}}


def test_the_trainers_master_weights_stay_the_default():
    """Without the flag, a trainer still trains float32 master weights of a bf16 base (what it always did)."""
    model, _ = wrapped(False, dtype=torch.bfloat16, lora=True)
    layer = model.get_input_embeddings()
    layer.grounded_embedding["default"].data = layer.grounded_embedding["default"].data.bfloat16()
    assert upcast_trainable(model) == ["base_model.model.model.embed_tokens.grounded_embedding.default"]
    assert adapter_dtypes(model) == {"rows": {torch.float32}, "lora": {torch.float32}}


# --- loading without the plugin -----------------------------------------------------------------------


def test_a_saved_config_loads_without_a_warning(tmp_path):
    model, _ = wrapped(False)
    model.save_pretrained(tmp_path / "adapter")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        base = build_tiny_model("llama", False)
        peft_grounded.add_tokens(fresh_tokenizer(), base, TOKENS)
        PeftModel.from_pretrained(base, tmp_path / "adapter")
    assert not [w for w in caught if "Unexpected keyword" in str(w.message)]


@pytest.mark.slow
def test_without_import_peft_fails_with_the_documented_key_error(tmp_path):
    """PEFT's own loader in a fresh interpreter that never imported peft_grounded (a documented limitation)."""
    model, _ = wrapped(False)
    model.save_pretrained(tmp_path / "adapter")
    code = f"from peft import PeftConfig; PeftConfig.from_pretrained({str(tmp_path / 'adapter')!r})"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == "KeyError: 'GROUNDED_TOKENS'"


# --- TRL's chat_template_path -------------------------------------------------------------------------


@pytest.fixture
def chat_source(tmp_path):
    """A tokenizer folder whose chat template uses a special token the model lacks (TRL clones both)."""
    source = fresh_tokenizer()
    source.add_special_tokens({"additional_special_tokens": ["<|turn|>"]})
    source.chat_template = "{% for m in messages %}<|turn|>{{ m['role'] }}\n{{ m['content'] }}{% endfor %}"
    source.save_pretrained(tmp_path / "chat")
    (tmp_path / "chat.jinja").write_text(source.chat_template)
    return tmp_path


def grounding_setup(extra_tokens=()):
    catalogue = toy_catalogue()
    index = toy_index(catalogue)
    tokenizer = fresh_tokenizer()
    model = build_tiny_model("llama", False)
    new = peft_grounded.add_tokens(tokenizer, model, [*extra_tokens, *index.token_strings])
    from peft_grounded.training.grounding import grounding_dataset

    return model, tokenizer, new, grounding_dataset(catalogue, index, tokenizer)


@pytest.mark.slow  # TRL's mean resizing of a 49k-row vocabulary takes ~10 s
def test_trls_chat_template_path_fails_with_a_grounded_config_as_documented(chat_source):
    from trl import SFTConfig, SFTTrainer

    model, tokenizer, new, data = grounding_setup()
    args = SFTConfig(
        output_dir=str(chat_source / "out"), max_steps=1, use_cpu=True, report_to="none",
        chat_template_path=str(chat_source / "chat"), max_length=64,
    )  # fmt: skip
    with pytest.raises(
        AttributeError, match="'GroundedTokenConfig' object has no attribute 'trainable_token_indices'"
    ):
        SFTTrainer(model, args=args, peft_config=GroundedTokenConfig(token_indices=new), train_dataset=data,
                   processing_class=tokenizer)  # fmt: skip


def test_the_packages_trainers_refuse_it_with_the_workaround(chat_source):
    from peft_grounded.training.grounding import GroundingTrainer
    from peft_grounded.training.stage_config import GroundingConfig

    model, tokenizer, new, data = grounding_setup()
    args = GroundingConfig(
        output_dir=str(chat_source / "out"),
        max_steps=1,
        use_cpu=True,
        chat_template_path=str(chat_source / "chat"),
    )
    with pytest.raises(ValueError, match=r"names a tokenizer.*Pass the template as a \.jinja file"):
        GroundingTrainer(model, args, peft_config=GroundedTokenConfig(token_indices=new), train_dataset=data,
                         processing_class=tokenizer)  # fmt: skip
    assert not (chat_source / "out").exists()
    assert len(tokenizer) == 49152 + len(new)  # nothing was added to the tokenizer either


@pytest.mark.parametrize("workaround", ["jinja file", "tokens added with the SIDs"])
def test_the_documented_workarounds_train(chat_source, workaround):
    from peft_grounded.training.grounding import GroundingTrainer
    from peft_grounded.training.stage_config import GroundingConfig

    extra = ["<|turn|>"] if workaround == "tokens added with the SIDs" else []
    model, tokenizer, new, data = grounding_setup(extra)
    options = {"chat_template_path": str(chat_source / "chat.jinja")} if workaround == "jinja file" else {}
    if extra:
        tokenizer.chat_template = (chat_source / "chat.jinja").read_text()
    args = GroundingConfig(
        output_dir=str(chat_source / "out"), max_steps=1, use_cpu=True, max_length=64, disable_tqdm=True,
        **options,
    )  # fmt: skip
    trainer = GroundingTrainer(
        model,
        args,
        peft_config=GroundedTokenConfig(token_indices=new),
        train_dataset=data,
        processing_class=tokenizer,
    )
    trainer.train()
    assert "<|turn|>" in tokenizer.chat_template
    assert (chat_source / "out" / "adapter" / "adapter_model.safetensors").is_file()
    if extra:  # the template's token is one of the adapter's trained rows
        assert tokenizer.convert_tokens_to_ids("<|turn|>") == new[0]


def test_a_lookup_of_peft_before_its_import_keeps_the_registration():
    """TRL and transformers look PEFT up (``find_spec``) to see whether it is installed; the registration hook
    must survive that and register when PEFT really loads (found by PEFT's own test matrix)."""
    code = (
        "import importlib.util, peft_grounded; importlib.util.find_spec('peft'); import peft.utils; "
        "print(getattr(peft.utils.get_peft_model_state_dict, '_grounded_patch', False), "
        "'GROUNDED_TOKENS' in peft.utils.peft_types.PeftType.__members__)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.stdout.split() == ["True", "True"], result.stderr[-2000:]
