"""The benchmark scripts. Each runs on its own (``python benchmarks/NAME.py``); the tests import their helpers as
this package (pytest puts the repository root on ``sys.path``: ``pythonpath`` in pyproject.toml)."""
