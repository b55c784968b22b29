"""What the command line prints for an exception a user can fix: one ``error: ...`` line, never a traceback.

The sentences come from :mod:`peft_grounded._errors` (a low module, so that library layers such as
:mod:`peft_grounded.serving` use them without importing the command line).
"""

from __future__ import annotations

from .._errors import EXIT_INTERRUPTED, EXIT_USAGE, describe

__all__ = ["EXIT_INTERRUPTED", "EXIT_USAGE", "describe"]
