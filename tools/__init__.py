"""Developer tools run from a checkout (`python -m tools.bench.<name>`), not installed."""
