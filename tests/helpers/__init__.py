"""Modules the tests share (fixtures, small runs as scripts, the loopback Hub); see tests/README.md."""
