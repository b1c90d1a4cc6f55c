"""The ``fedauc`` command line (entry point ``pipelines.cli:app``). Thin: every command parses arguments and calls
into a package. Each module here holds one group of commands; this one puts them on the app, in the order
``fedauc --help`` lists them."""

from __future__ import annotations

from pipelines.cli import centre, consortium, data, evaluation, hospital, operations, retention, sites, training
from pipelines.cli.application import app

app.command()(data.inspect)
app.command()(data.synth)
app.command()(data.preprocess)
app.command()(operations.demo)
app.command("train")(training.train_command)
app.command("evaluate")(evaluation.evaluate_command)
app.command("compare")(training.compare_command)
app.command("card")(evaluation.card_command)
app.command("predict")(hospital.predict_command)
app.command("thresholds")(hospital.thresholds_command)
app.command("pacs")(hospital.pacs_command)
app.command()(operations.ui)
app.command()(operations.deploy)
app.command("prune")(retention.prune_command)
app.add_typer(sites.sites_app, name="sites")
app.add_typer(sites.federation_app, name="federation")
app.add_typer(consortium.consortium_app, name="consortium")
app.add_typer(centre.centre_app, name="centre")

__all__ = ["app"]
