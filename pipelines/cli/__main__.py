"""``python -m pipelines.cli ...`` runs the ``fedauc`` command line."""

from pipelines.cli import app

app()
