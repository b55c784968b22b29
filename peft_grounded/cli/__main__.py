"""``python -m peft_grounded.cli``: the ``peft-grounded`` command."""

from . import run

run()
