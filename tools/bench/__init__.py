"""The speed benchmarks and the record and bit-for-bit comparisons of two code versions
(docs/benchmarks.md): run from a checkout's root, e.g. `python -m tools.bench.backends`."""
