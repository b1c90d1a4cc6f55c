"""A year of a centre (docs/consortium.md, docs/performance.md): ``python -m benchmarks.year``."""
