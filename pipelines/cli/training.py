"""``fedauc train`` and ``fedauc compare``: train one algorithm on a federation (in this process or as an NVIDIA
FLARE job) and tabulate the trainings (``fedauc evaluate``: pipelines/cli/evaluation.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from pipelines.cli.application import flows
from pipelines.cli.train_options import OPTION_NAMES, FlareEnv, TrainBackend, command_signature, setting_values

if TYPE_CHECKING:
    from federated.launch import Launcher

def launcher_from_options(backend: TrainBackend, flare_env: FlareEnv | None, flare_workspace: str | None,
                          kit: str | None) -> Launcher:
    """The launcher the options name, checked (a wrong combination is one line with its fix): each launcher
    takes the options it declares (``federated.launch._Launcher.options``) and refuses the others'."""
    from federated.launch import LAUNCHERS

    given = {"--flare-env": flare_env and flare_env.value, "--flare-workspace": flare_workspace, "--kit": kit}
    chosen = LAUNCHERS[backend.value].from_options(given)
    chosen.check()
    return chosen


def train_command(**given: Any) -> None:
    """Train one algorithm on one federation (the Prefect flow train_federated), logged to MLflow."""
    import json

    from pipelines.checks import check_training
    from pipelines.prefect_env import configure_prefect_env
    from pipelines.tracking import run_outputs_dir

    federation, shards = given.pop("federation"), given.pop("shards")
    launcher = launcher_from_options(given.pop("backend"), given.pop("flare_env"), given.pop("flare_workspace"),
                                     given.pop("kit"))
    run_name = given.pop("run_name") or f"{given['algorithm']}-I{given['local_steps']}"
    checkpoint_dir = given["checkpoint_dir"] or launcher.checkpoint_dir(run_name, run_outputs_dir())
    values = setting_values(given, checkpoint_dir, launcher.waits_for_sites)
    # The settings are validated here, once, and go whole to the flow and the engine, which trust them.
    _, shards_root, settings = check_training(federation, shards, values, launcher, OPTION_NAMES)
    configure_prefect_env()
    summary = flows().train_federated(federation, str(shards_root), settings, run_name,
                                      launcher.model_dump(mode="json"))
    typer.echo(json.dumps(summary, indent=2))


# typer reads the options from the signature: the command's own, then one per setting (pipelines/cli/train_options.py).
train_command.__signature__ = command_signature()


COMPARE_SUMMARY = ("run", "federation", "status", "algorithm", "I", "AUC macro", "pAUC0.3 macro", "MB sent",
                   "minutes")


def compare_command(
    experiment: str = typer.Option("chest-xray", "--experiment", help="chest-xray or melanoma."),
    sort_by: str = typer.Option("AUC macro", "--sort-by", help="A column of the table."),
    show_all: bool = typer.Option(False, "--all", help="Also list failed, killed and running trainings."),
    federation: str = typer.Option(None, "--federation", help="Only this federation's trainings (its name)."),
    csv_path: str = typer.Option(None, "--csv", help="Also write the table to this CSV file."),
    html_path: str = typer.Option(None, "--html", help="Also write the table to this HTML file."),
    wide: bool = typer.Option(False, "--wide", help="Every column (sites, per-disease AUC / pAUC), not the "
                              "100-column summary."),
) -> None:
    """The experiment's trainings as a table: run, federation, status, algorithm, I, pooled test macro AUC
    [95 % interval] and pAUC, MB sent, minutes (--wide: sites and per disease too; --csv / --html: all).
    Unfinished runs are hidden unless --all."""
    from rich.console import Console

    from pipelines.compare import read_trainings, training_rows
    from pipelines.store_uri import tracking_uri
    from pipelines.tables import fold_interval_rows, rich_table, write_table

    try:  # an MLflow server is read over HTTP without importing MLflow (pipelines/compare.py), nor pandas here
        columns, rows, hidden = training_rows(read_trainings(experiment, tracking_uri()), sort_by, show_all)
    except ValueError as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(code=1) from None
    if federation is not None:
        rows = [row for row in rows if row["federation"] == federation]
    title = f"{experiment}{f' / {federation}' if federation else ''}: pooled test metrics, best first"
    shown, cells = fold_interval_rows(columns, rows)
    if not wide:  # readable in a 100-column terminal; the rest in --wide, --csv, --html and MLflow
        shown = [c for c in COMPARE_SUMMARY if c in shown]
    Console(width=240 if wide else 100).print(
        rich_table(shown, cells, title, keep_whole=("run", "federation", "sites") if wide else ()))
    if hidden:
        typer.echo(f"{hidden} unfinished training(s) hidden (failed, killed or running); --all lists them")
    for path in filter(None, (csv_path, html_path)):
        import pandas as pd

        write_table(pd.DataFrame(rows, columns=columns), path, title)
        typer.echo(f"wrote {path}")
