"""Notices that the package's own calls make other libraries print, and that its user can do nothing about.

Each is silenced as narrowly as it can be (its message, its category and the module that issues it), and
only where the package's call causes it; a notice that the user's own code causes stays on screen.

* :func:`peft_wrapping`: PEFT's ``PeftModel`` reads the base model's ``is_gradient_checkpointing``, which
  transformers 5 deprecates with a ``FutureWarning`` at every read; wrap the package's ``get_peft_model`` and
  ``PeftModel.from_pretrained`` calls in it. (The package's training settings do not set transformers'
  deprecated ``gradient_checkpointing`` alias, see :class:`~peft_grounded.training.stage_config.RunConfig`, so that
  warning is not triggered at all.)
* :func:`quiet_deepspeed_cpu_notice`: where DeepSpeed is installed, accelerate imports it to unwrap a model
  (every ``save_pretrained``, TRL's trainer), and DeepSpeed's accelerator detection then logs "Setting
  accelerator to CPU ..." on a machine without a GPU, once per process; the filter drops that one record of
  DeepSpeed's logger (installed when the package is imported; it imports nothing).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

DEEPSPEED_LOGGER = "DeepSpeed"
DEEPSPEED_CPU_NOTICE = "Setting accelerator to CPU."


@contextmanager
def peft_wrapping() -> Iterator[None]:
    """Within: transformers' ``FutureWarning`` that ``is_gradient_checkpointing`` is deprecated, which PEFT's
    ``PeftModel.__init__`` triggers by reading it, is not shown; every other warning is."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore",
            message=r"`is_gradient_checkpointing` is deprecated",
            category=FutureWarning,
            module=r"transformers\.modeling_utils",
        )
        yield


class _DeepSpeedCPUNotice(logging.Filter):
    """Drops DeepSpeed's "Setting accelerator to CPU" notice of its accelerator detection, nothing else."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            record.module == "real_accelerator"
            and record.funcName == "get_accelerator"
            and str(record.msg).startswith(DEEPSPEED_CPU_NOTICE)
        )


def quiet_deepspeed_cpu_notice() -> None:
    """Install the filter on DeepSpeed's logger (once; its handlers come when DeepSpeed is imported)."""
    logger = logging.getLogger(DEEPSPEED_LOGGER)
    if not any(isinstance(f, _DeepSpeedCPUNotice) for f in logger.filters):
        logger.addFilter(_DeepSpeedCPUNotice())
