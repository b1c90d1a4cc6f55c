"""A consortium of up to 64 hospitals (docs/performance.md): ``python -m benchmarks.scale``."""
