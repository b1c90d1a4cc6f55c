"""Quality studies, each behind a default or a threshold it chose: ``python -m benchmarks.studies.<name>``."""
