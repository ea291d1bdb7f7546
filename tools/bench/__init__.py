"""Benchmarks outside the installed package, run as `python -m tools.bench.<name>`."""
