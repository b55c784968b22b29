"""Make ``GROUNDED_TOKENS`` a PEFT method: a ``PeftType`` member, PEFT's registries, and the save path.

PEFT keeps its method names in the ``PeftType`` enum; a plugin has to add a member before calling
``peft.utils.register_peft_method``. After registration ``get_peft_model``, ``PeftConfig.from_pretrained``,
``PeftModel.from_pretrained`` and ``load_adapter`` work like for PEFT's own methods.
"""

from __future__ import annotations

import functools

from peft.utils.peft_types import PeftType

from .saved import PEFT_TYPE

NAME = PEFT_TYPE.lower()


def _extend_peft_type(member_name: str) -> PeftType:
    """Add ``member_name`` to :class:`peft.utils.peft_types.PeftType` (idempotent)."""
    if member_name in PeftType.__members__:
        return PeftType[member_name]
    member = str.__new__(PeftType, member_name)
    member._name_ = member_name
    member._value_ = member_name
    member.__objclass__ = PeftType
    member._sort_order_ = len(PeftType._member_names_)
    type.__setattr__(PeftType, member_name, member)
    PeftType._member_map_[member_name] = member
    PeftType._value2member_map_[member_name] = member
    PeftType._member_names_.append(member_name)
    return member


GROUNDED_TOKENS = _extend_peft_type(PEFT_TYPE)


def register(config_cls: type, model_cls: type) -> None:
    """Register the method with PEFT (idempotent) and keep PEFT from saving whole embedding matrices."""
    from peft.mapping import PEFT_TYPE_TO_TUNER_MAPPING
    from peft.utils import register_peft_method

    if PEFT_TYPE_TO_TUNER_MAPPING.get(GROUNDED_TOKENS) is not model_cls:
        register_peft_method(name=NAME, config_cls=config_cls, model_cls=model_cls, prefix=model_cls.prefix)
    _patch_embedding_save()


def _patch_embedding_save() -> None:
    """Resolve ``save_embedding_layers="auto"`` to False for grounded adapters.

    PEFT's "auto" writes the whole embedding matrix (and an untied head) next to an adapter whenever the
    vocabulary was resized, which is always the case here; ``Trainer`` checkpoints and ``push_to_hub`` use
    "auto". A grounded adapter already holds every row that differs from the base, and its config pins the
    base (vocabulary size, signature, fingerprint), so the full matrix is pure waste. An explicit
    ``save_embedding_layers=True`` is still honoured.
    """
    import peft
    import peft.peft_model
    import peft.utils
    import peft.utils.save_and_load as save_and_load

    original = save_and_load.get_peft_model_state_dict
    if getattr(original, "_grounded_patch", False):
        return

    @functools.wraps(original)
    def get_peft_model_state_dict(
        model, state_dict=None, adapter_name="default", unwrap_compiled=False, save_embedding_layers="auto"
    ):
        config = model.peft_config[adapter_name]
        if save_embedding_layers == "auto" and config.peft_type == GROUNDED_TOKENS:
            save_embedding_layers = False
        return original(
            model,
            state_dict=state_dict,
            adapter_name=adapter_name,
            unwrap_compiled=unwrap_compiled,
            save_embedding_layers=save_embedding_layers,
        )

    get_peft_model_state_dict._grounded_patch = True
    for module in (save_and_load, peft.utils, peft.peft_model, peft):
        if getattr(module, "get_peft_model_state_dict", None) is original:
            module.get_peft_model_state_dict = get_peft_model_state_dict
