"""The claims benchmark (docs/claims.md): ``python -m benchmarks.claims``."""
