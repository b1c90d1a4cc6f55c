"""The ``fedauc`` command line. Thin: every command parses arguments and calls into a package."""

from __future__ import annotations

import typer

app = typer.Typer(
    help="Federated AUC maximization for hospitals: onboard sites, preprocess, train, compare.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
sites_app = typer.Typer(help="Declare, validate and report on hospital sites.", no_args_is_help=True)
app.add_typer(sites_app, name="sites")
