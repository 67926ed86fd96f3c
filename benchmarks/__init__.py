"""Benchmark CLIs that print figures (``python -m benchmarks.<name> --help``); no test times anything."""
