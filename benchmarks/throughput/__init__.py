"""Speed and memory, each target a ratio measured in one run (docs/performance.md):
``python -m benchmarks.throughput.<name>``."""
