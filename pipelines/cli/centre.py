"""``fedauc centre backup`` / ``fedauc centre restore``: the coordinating centre's state into one folder and back
(pipelines/centre_backup.py)."""

from __future__ import annotations

import typer

from pipelines.cli.application import fail

centre_app = typer.Typer(help="The coordinating centre's state: back it up, restore it onto another folder.",
                         no_args_is_help=True)


@centre_app.command("backup")
def centre_backup(
    dest: str = typer.Argument(..., help="A new folder for the backup (owner-only)."),
    mlflow_uri: str = typer.Option(None, "--mlflow", envvar="MLFLOW_TRACKING_URI",
                                   help="The MLflow store's SQLite URI (default: the embedded store)."),
    artifacts: str = typer.Option(None, "--mlflow-artifacts",
                                  help="MLflow's artifact folder (default: mlartifacts/ beside its database)."),
    prefect_db: str = typer.Option(None, "--prefect-db", envvar="PREFECT_API_DATABASE_CONNECTION_URL",
                                   help="The Prefect server's SQLite URI (none: not backed up)."),
    provisioning: str = typer.Option(None, "--provisioning", help="`fedauc consortium provision`'s --out folder."),
    settings: list[str] = typer.Option([], "--settings", help="A consortium settings file (federation YAML); repeatable."),
) -> None:
    """Copy MLflow's and Prefect's SQLite databases (SQLite's online backup), MLflow's artifacts and the
    provisioning folder (tar, modes kept) and the settings into DEST, with a manifest of their checksums."""
    from pathlib import Path

    from common.errors import FedaucError
    from pipelines.centre_backup import backup
    from pipelines.tracking import default_tracking_uri

    try:
        manifest = backup(dest, mlflow_uri or default_tracking_uri(), Path(artifacts) if artifacts else None, prefect_db,
                          Path(provisioning) if provisioning else None, [Path(s) for s in settings])
    except FedaucError as err:
        fail(err)
    typer.echo(f"centre backed up into {manifest.parent} ({manifest.name} lists each part and its sha256); keep it "
               "where the root CA's key may be: it holds it")


@centre_app.command("restore")
def centre_restore(
    source: str = typer.Argument(..., help="The folder `fedauc centre backup` wrote."),
    to: str = typer.Option(..., "--to", help="An empty folder for the centre's state."),
) -> None:
    """Check every part against the manifest and unpack them onto an empty folder; say how to point the
    servers at it."""
    from common.errors import FedaucError
    from pipelines.centre_backup import restore

    try:
        where = restore(source, to)
    except FedaucError as err:
        fail(err)
    typer.echo(f"MLFLOW_TRACKING_URI=sqlite:///{where['mlflow']}")
    if "artifacts" in where:
        typer.echo(f"MLflow artifacts: {where['artifacts']} (the store's URIs point there)")
    if "prefect" in where:
        typer.echo(f"PREFECT_API_DATABASE_CONNECTION_URL=sqlite+aiosqlite:///{where['prefect']}")
    if "provisioning" in where:
        typer.echo(f"provisioning folder (root CA and kits): {where['provisioning']}")
    if "settings" in where:
        typer.echo(f"settings: {where['settings']}")
