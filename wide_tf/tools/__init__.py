"""Tools outside the library core: the speed benchmarks."""
