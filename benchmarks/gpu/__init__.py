"""The prepared GPU run (see README.md here); ``gpu_run.py`` and ``transfer.py`` also run as scripts."""
