"""``python -m peft_grounded.cli``: the ``peft-grounded`` command."""

import sys

from . import main

sys.exit(main())
