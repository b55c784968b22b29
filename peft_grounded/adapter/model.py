"""``GroundedTokenModel``: the PEFT tuner that installs grounded-token layers (and an optional LoRA)."""

from __future__ import annotations

import copy
import math
from dataclasses import replace

import torch
from peft import LoraConfig
from peft.tuners.lora import LoraLayer, LoraModel
from peft.tuners.tuners_utils import (
    BaseTuner,
    _maybe_include_all_linear_layers,
    check_target_module_exists,
    set_adapter,
)
from peft.utils.other import get_pattern_key
from torch import nn

from .config import GroundedProvenance, GroundedTokenConfig
from .initialize import initializer_range, start_rows
from .layer import GroundedHead, GroundedTiedEmbedding, GroundedTokenLayer, is_offloaded

SIGNATURE_ROWS = 8
SIGNATURE_RTOL = 2e-2


def embedding_signature(weight: torch.Tensor, original_vocab_size: int) -> list[float]:
    """Norms of a few fixed rows of the original vocabulary: cheap to check, robust to dtype changes."""
    positions = sorted(
        {round(j * (original_vocab_size - 1) / (SIGNATURE_ROWS - 1)) for j in range(SIGNATURE_ROWS)}
    )
    norms = weight.detach()[torch.as_tensor(positions, device=weight.device)].double().norm(dim=1)
    return [float(f"{n:.6g}") for n in norms.cpu().tolist()]


def signature_matches(recorded: list[float] | None, actual: list[float]) -> bool:
    """Whether an adapter's recorded embedding signature fits a base's (tolerant of dtype changes)."""
    if recorded is None:
        return True
    return len(recorded) == len(actual) and all(
        math.isclose(a, b, rel_tol=SIGNATURE_RTOL, abs_tol=1e-6)
        for a, b in zip(recorded, actual, strict=True)
    )


class GroundedTokenModel(BaseTuner):
    """Wraps the input embedding (and the output head) so that only the new tokens' rows train."""

    prefix: str = "grounded_"
    tuner_layer_cls = GroundedTokenLayer
    target_module_mapping: dict = {}  # noqa: RUF012

    def __init__(self, model, config, adapter_name, low_cpu_mem_usage: bool = False, state_dict=None) -> None:
        self._lora_configs: dict[int, LoraConfig] = {}
        self._no_lora: set[str] = set()
        self._autocast: dict[str, bool] = {}  # adapter -> the autocast_adapter_dtype it was created with
        super().__init__(
            model, config, adapter_name, low_cpu_mem_usage=low_cpu_mem_usage, state_dict=state_dict
        )

    # --- targeting ---------------------------------------------------------------------------------------

    def _prepare_adapter_config(
        self, peft_config: GroundedTokenConfig, model_config: dict
    ) -> GroundedTokenConfig:
        if peft_config.target_modules is None:
            name = _input_embedding_name(self.model)
            if name is None:
                raise ValueError(
                    "Could not find the model's input embedding; set target_modules to its module name."
                )
            peft_config.target_modules = name
        # refuse an unsupported architecture before touching the model
        self._tied_embedding_names(peft_config)
        self._no_lora = self._embedding_module_names()
        return peft_config

    def _tied_embedding_names(self, config: GroundedTokenConfig) -> list[str]:
        """Embedding modules other than the input embedding and the head on the input embedding's weight (T5's
        and BART's), each to get a :class:`GroundedTiedEmbedding`; refuses a model whose other modules on that
        weight, or embeddings of its shape on another weight, could not be given the rows."""
        embedding = _input_embedding(self.model)
        weight = getattr(embedding, "weight", None)  # a GroundedTokenLayer's is its base layer's
        if not isinstance(weight, torch.Tensor):
            return []
        wrappers = (GroundedTokenLayer, GroundedHead, GroundedTiedEmbedding)
        head = self._output_layer(config)
        names, inside = [], []
        for name, module in self.model.named_modules(remove_duplicate=False):
            if any(name.startswith(f"{w}.") for w in inside):
                continue
            if isinstance(module, wrappers):
                inside.append(name)
                continue
            if module is embedding or module is head:
                continue
            other = getattr(module, "weight", None)
            if isinstance(module, nn.Embedding) and other is not weight and other.shape == weight.shape:
                raise ValueError(
                    f"Module {name!r} embeds the same vocabulary as the input embedding but holds a separate weight "
                    "(e.g. an untied BART loaded from a checkpoint), so its new-token rows would stay frozen. Tie it "
                    "to the input embedding first (model.tie_weights() or set it to model.get_input_embeddings())."
                )
            if other is not weight:
                continue
            if not isinstance(module, nn.Embedding):
                raise ValueError(
                    f"Module {name!r} ({type(module).__name__}) shares the input embedding's weight but is not an "
                    "nn.Embedding or the output head, so the grounded-token adapter cannot give it the new rows: it "
                    "would keep the frozen rows and merge() would change its output. This architecture is not "
                    "supported."
                )
            names.append(name)
        return names

    def _lora_config(self, config: GroundedTokenConfig) -> LoraConfig | None:
        if not config.has_lora:
            return None
        key = id(config)
        if key not in self._lora_configs:
            lora = LoraConfig(**copy.deepcopy(config.lora), task_type=config.task_type)
            lora = _maybe_include_all_linear_layers(lora, self.model)
            self._lora_configs[key] = lora
        return self._lora_configs[key]

    def _check_target_module_exists(self, config: GroundedTokenConfig, key: str):  # type: ignore[override]
        if check_target_module_exists(config, key):
            return True
        lora = self._lora_config(config)
        return lora is not None and self._lora_targets(lora, key)

    def _lora_targets(self, lora: LoraConfig, key: str) -> bool:
        """Whether the stacked LoRA targets module ``key``: never an embedding or the head."""
        if any(key == name or key.startswith(name + ".") for name in self._no_lora):
            return False
        return bool(check_target_module_exists(lora, key))

    def _embedding_module_names(self) -> set[str]:
        """The embeddings and the output head: their new rows are the adapter's own, so LoRA never targets them."""
        embedding = _input_embedding(self.model)
        head = getattr(self.model, "get_output_embeddings", lambda: None)()
        weight = getattr(embedding, "weight", None)
        return {
            name
            for name, m in self.model.named_modules()
            if m is embedding
            or m is head
            or (
                weight is not None
                and isinstance(m, (nn.Embedding, GroundedTiedEmbedding))
                and m.weight is weight
            )
        }

    def _create_and_replace(self, config, adapter_name, target, target_name, parent, current_key, **kwargs):
        if check_target_module_exists(config, current_key):
            self._add_token_rows(config, adapter_name, target, target_name, parent)
        else:
            self._add_lora(config, adapter_name, target, target_name, parent, current_key)

    # --- token rows --------------------------------------------------------------------------------------

    def _output_layer(self, config: GroundedTokenConfig) -> nn.Module | None:
        """The model's own output layer (unwrapped), or None if the model has none."""
        if config.output_module is not None:
            try:
                head = self.model.get_submodule(config.output_module)
            except AttributeError as err:
                raise ValueError(
                    f"output_module={config.output_module!r} is not a module of this model."
                ) from err
        else:
            head = getattr(self.model, "get_output_embeddings", lambda: None)()
        if isinstance(head, GroundedHead):
            head = head.base_layer
        return head

    def _add_token_rows(self, config, adapter_name, target, target_name, parent) -> None:
        head = self._output_layer(config)
        untied = self.get_model_config(self.model).get("tie_word_embeddings") is False
        if head is None and untied and config.train_output_rows:
            raise ValueError(
                "The model's head is untied but its output layer could not be found, so the new tokens' output "
                "rows cannot train. Set output_module to the head's module name, or train_output_rows=False."
            )
        # every check and the initialisation run before the model is touched, so a bad input leaves it intact
        layer = (
            target
            if isinstance(target, GroundedTokenLayer)
            else GroundedTokenLayer(target, adapter_name, head)
        )
        self._check_fits(config, layer)
        input_rows, output_rows = start_rows(config, layer, initializer_range(self.model))
        if not config.runtime_config.rows_from_checkpoint:
            config.record_start()
        if layer is not target:
            self._replace_module(parent, target_name, layer, target)
        layer.update_layer(adapter_name, config.token_indices, input_rows, output_rows)

    def _check_fits(self, config: GroundedTokenConfig, layer: GroundedTokenLayer) -> None:
        for module in (layer.base_layer, layer.head):
            weight = getattr(module, "weight", None)
            if weight is not None and weight.is_meta and not is_offloaded(module):
                raise ValueError(
                    "The base model's embedding (or head) is on the meta device, i.e. not loaded: the adapter reads "
                    "its rows to check the base and to place and initialise the new tokens. Under FSDP this is "
                    "accelerate's cpu_ram_efficient_loading, which loads the weights in the first process only: set "
                    "fsdp_cpu_ram_efficient_loading: false in the accelerate config (docs/distributed.md)."
                )
        rows = layer.num_embeddings
        made = config.provenance or GroundedProvenance()
        if made.num_embeddings is not None and made.num_embeddings != rows:
            raise ValueError(
                f"This adapter was made for an embedding with {made.num_embeddings} rows, but the base has {rows}. "
                "Add the adapter's tokens to the base first (peft_grounded.hub.load_grounded does it, or "
                "peft_grounded.add_tokens with config.token_strings), in the same order."
            )
        outside = [i for i in config.token_indices if i >= rows]
        if outside:
            raise ValueError(
                f"token_indices {outside[:5]} are out of range for an embedding with {rows} rows. Add the tokens "
                "and resize the model first (peft_grounded.add_tokens), then wrap it."
            )
        head = layer.head
        if (
            head is not None
            and not layer.tied
            and config.train_output_rows
            and head.weight.shape[0] <= max(config.token_indices)
        ):
            raise ValueError(
                f"The output head has {head.weight.shape[0]} rows, too few for token index {max(config.token_indices)}: "
                "it was not resized with the input embedding. Resize both (model.resize_token_embeddings resizes "
                "the head returned by get_output_embeddings)."
            )
        signature = embedding_signature(layer.base_layer.weight, config.base_vocab_size)
        if not signature_matches(made.embedding_signature, signature):
            raise ValueError(
                "The base model's vocabulary rows differ from those the adapter was made for (embedding signature "
                f"{signature} vs {made.embedding_signature}): this adapter belongs to another base model "
                f"({config.base_model_name_or_path!r}). Load it onto that model."
            )
        config.provenance = replace(
            made, num_embeddings=rows, embedding_signature=made.embedding_signature or signature
        )

    # --- LoRA ----------------------------------------------------------------------------------------------

    def _add_lora(self, config, adapter_name, target, target_name, parent, current_key) -> None:
        lora = self._lora_config(config)
        r = lora.rank_pattern.get(get_pattern_key(lora.rank_pattern.keys(), current_key), lora.r)
        alpha = lora.alpha_pattern.get(
            get_pattern_key(lora.alpha_pattern.keys(), current_key), lora.lora_alpha
        )
        if isinstance(target, LoraLayer):
            target.update_layer(adapter_name, r, lora_alpha=alpha, config=lora, target_name=current_key)
            return
        kwargs = {
            "r": r,
            "lora_alpha": alpha,
            "target_name": current_key,
            "ephemeral_gpu_offload": False,
            "loaded_in_8bit": getattr(self.model, "is_loaded_in_8bit", False),
            "loaded_in_4bit": getattr(self.model, "is_loaded_in_4bit", False),
        }
        new_module = LoraModel._create_new_module(lora, adapter_name, target, **kwargs)
        if adapter_name not in self.active_adapters:
            new_module.requires_grad_(False)
        self._replace_module(parent, target_name, new_module, target)

    def _get_tied_target_modules(self, model: nn.Module) -> list[str]:
        # Tied heads are handled by design (GroundedHead shares the embedding's rows), so PEFT's warning about
        # adapters on tied modules does not apply.
        return []

    def inject_lora(self, adapter_name: str) -> list[str]:
        """Add LoRA layers, as described by the adapter's config, to an adapter that already has its rows."""
        config = self.peft_config[adapter_name]
        self._lora_configs.pop(id(config), None)
        self._no_lora = self._embedding_module_names()
        lora = self._lora_config(config)
        if lora is None:
            raise ValueError(
                f"Adapter {adapter_name!r} has no LoRA (lora=None): set its config's lora first."
            )
        names = [
            key
            for key, module in self.model.named_modules()
            if not isinstance(module, (LoraLayer, GroundedTokenLayer, GroundedHead, GroundedTiedEmbedding))
            and self._lora_targets(lora, key)
            and not any(key.startswith(f"{m}.") for m in self.targeted_module_names)
        ]
        if not names:
            raise ValueError(
                f"lora target_modules={config.lora['target_modules']!r} matched no module of the model."
            )
        for key in names:
            parent_name, _, child = key.rpartition(".")
            parent = self.model.get_submodule(parent_name) if parent_name else self.model
            self._add_lora(config, adapter_name, self.model.get_submodule(key), child, parent, key)
        self.targeted_module_names.extend(n for n in names if n not in self.targeted_module_names)
        # the stacked LoRA follows the rule the rows were created with (get_peft_model's autocast_adapter_dtype)
        self._cast_adapter_dtype(adapter_name, self.adapter_autocast(adapter_name))
        self.set_adapter(self.active_adapters, inference_mode=config.inference_mode)
        self._mark_only_adapters_as_trainable(self.model)
        return names

    def _cast_adapter_dtype(self, adapter_name: str, autocast_adapter_dtype: bool = True) -> None:
        """PEFT's rule, the rows included; recorded, so that a LoRA stacked later (:meth:`inject_lora`) follows it."""
        self._autocast[adapter_name] = autocast_adapter_dtype
        super()._cast_adapter_dtype(adapter_name, autocast_adapter_dtype=autocast_adapter_dtype)
        if not autocast_adapter_dtype:  # the rows start as float32 masters (see layer._master)
            for module in self.model.modules():
                if isinstance(module, GroundedTokenLayer):
                    module.cast_rows_to_base(adapter_name)

    def adapter_autocast(self, adapter_name: str) -> bool:
        """The ``autocast_adapter_dtype`` the adapter was created with (True when PEFT did not say)."""
        return self._autocast.get(adapter_name, True)

    def set_adapter(self, adapter_name: str | list[str], inference_mode: bool = False) -> None:
        """Activate adapters on the rows and on the stacked LoRA layers alike (PEFT's own switches only the
        ``tuner_layer_cls`` layers, which would leave a LoRA on the previous adapter)."""
        layers = (GroundedTokenLayer, LoraLayer)
        set_adapter(self.model, adapter_name, inference_mode=inference_mode, layer_cls=layers)  # type: ignore[arg-type]
        self.active_adapter = adapter_name

    # --- after injection -----------------------------------------------------------------------------------

    def inject_adapter(self, model: nn.Module, adapter_name: str, **kwargs) -> None:
        # PEFT's convention: the model holds the caller's config itself (PeftModel.from_pretrained(config=...)
        # keeps it) and creation records its facts there. A config that already records another base, filled
        # by wrapping an earlier model, gives this model a copy of its own, so one config wraps several models.
        config = self.peft_config[adapter_name]
        if not config.runtime_config.rows_from_checkpoint and not _describes(config, model):
            self.peft_config[adapter_name] = _for_another_base(config)
        super().inject_adapter(model, adapter_name, **kwargs)
        embedding = _grounded_layer(model, adapter_name)
        if embedding is None:
            raise ValueError(
                "The grounded-token adapter did not find the input embedding; set target_modules."
            )
        head = embedding.head
        if head is not None and not any(
            isinstance(m, GroundedHead) and m.base_layer is head for m in model.modules()
        ):
            name = next(n for n, m in model.named_modules() if m is head)
            model.set_submodule(name, GroundedHead(head, embedding))
        for name in self._tied_embedding_names(self.peft_config[adapter_name]):
            model.set_submodule(name, GroundedTiedEmbedding(model.get_submodule(name), embedding))
        model.resize_token_embeddings = ResizeGuard()  # resizing now would misplace or drop the rows

    def _unload_and_optionally_merge(
        self, merge=True, progressbar=False, safe_merge=False, adapter_names=None
    ):
        model = super()._unload_and_optionally_merge(
            merge=merge, progressbar=progressbar, safe_merge=safe_merge, adapter_names=adapter_names
        )
        model.__dict__.pop("resize_token_embeddings", None)
        return model

    def grounded_token_ids(self) -> torch.Tensor:
        """The sorted token ids of the active adapters' new rows."""
        layer = self.model.get_input_embeddings()
        names = [n for n in layer.active_adapters if n in layer.grounded_indices]
        if not names:
            raise ValueError("No active grounded-token adapter: set_adapter() one that has new rows.")
        return torch.cat([layer.grounded_indices[n] for n in names]).unique(sorted=True)


def _input_embedding(model: nn.Module) -> nn.Module | None:
    getter = getattr(model, "get_input_embeddings", None)
    return getter() if getter is not None else None


def _input_embedding_name(model: nn.Module) -> str | None:
    """The module name of ``model.get_input_embeddings()`` (None without one), found as PEFT's TrainableTokens
    finds it, through transformers' public ``get_input_embeddings``."""
    embedding = _input_embedding(model)
    if embedding is None:
        return None
    return next((name for name, module in model.named_modules() if module is embedding), None)


def _grounded_layer(model: nn.Module, adapter_name: str) -> GroundedTokenLayer | None:
    """The grounded layer of ``model``: its input embedding, or, for a model without ``get_input_embeddings``
    (a plain ``nn.Module``, as TrainableTokens wraps too), the layer ``target_modules`` made for the adapter."""
    if hasattr(model, "get_input_embeddings"):
        embedding = model.get_input_embeddings()
        return embedding if isinstance(embedding, GroundedTokenLayer) else None
    return next(
        (
            m
            for m in model.modules()
            if isinstance(m, GroundedTokenLayer) and adapter_name in m.grounded_embedding
        ),
        None,
    )


def _describes(config: GroundedTokenConfig, model: nn.Module) -> bool:
    """Whether ``config``'s provenance fits ``model``'s input embedding (True where it records nothing yet, or
    where the weight cannot be read before wrapping: creation checks it then)."""
    made = config.provenance
    if made is None or (made.num_embeddings is None and made.embedding_signature is None):
        return True
    weight = getattr(_input_embedding(model), "weight", None)  # a GroundedTokenLayer's is its base layer's
    if not isinstance(weight, torch.Tensor) or weight.is_meta or weight.ndim != 2:
        return True
    if made.num_embeddings is not None and made.num_embeddings != weight.shape[0]:
        return False
    if made.embedding_signature is None or weight.shape[0] < config.base_vocab_size:
        return True
    return signature_matches(made.embedding_signature, embedding_signature(weight, config.base_vocab_size))


def _for_another_base(config: GroundedTokenConfig) -> GroundedTokenConfig:
    """A copy of ``config`` for a model on another base: the same hyperparameters and start data, none of the
    facts recorded from the earlier base."""
    own = copy.copy(config)
    own.runtime_config = copy.copy(config.runtime_config)
    own.provenance = replace(config.provenance, num_embeddings=None, embedding_signature=None)
    return own


class ResizeGuard:
    """Stands in for ``resize_token_embeddings`` on a wrapped model and refuses (a class, so that the model still
    pickles)."""

    def __call__(self, *args, **kwargs):
        raise RuntimeError(
            "This model carries a grounded-token adapter: resizing its embeddings now would misplace or drop the "
            "adapter's rows. Add tokens and resize before get_peft_model; to extend an adapted model, "
            "merge_and_unload() it first, add the tokens, and wrap it again."
        )
