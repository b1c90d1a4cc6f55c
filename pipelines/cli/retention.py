"""``fedauc prune``: the centre's stores pruned to its retention policy (pipelines/retention.py)."""

from __future__ import annotations

import typer

from pipelines.cli.application import fail


def prune_command(
    # Its default is read when the command runs: importing pipelines.retention (MLflow, torch) here would slow
    # every fedauc command's start.
    older_than_days: int = typer.Option(None, "--older-than-days", min=1,
                                        show_default="pipelines/retention.py RETENTION_DAYS",
                                        help="Remove the detail older than this (docs/consortium.md, Retention)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List what would go; change nothing."),
    backend_store_uri: str = typer.Option(None, "--backend-store-uri",
                                          help="The MLflow database, for `mlflow gc` (default: the embedded "
                                               "SQLite store; with a tracking server, its database)."),
    kit: list[str] = typer.Option(None, "--kit",
                                  help="The admin's startup kit of a consortium the centre runs (repeat for each): "
                                       "its server's finished NVIDIA FLARE jobs are pruned too."),
    flare_workspace: list[str] = typer.Option(None, "--flare-workspace",
                                              help="A --flare-workspace of trainings run here (repeat for each): its "
                                                   "old simulator job folders and POC consortia are removed too."),
) -> None:
    """Remove evaluation and PACS-scoring runs, Prefect's finished flow runs (when PREFECT_API_URL names a
    server), finished trainings' checkpoint rounds but the final, the finished NVIDIA FLARE jobs of each
    --kit's consortium and the simulator and POC runs left in each --flare-workspace, older than
    --older-than-days. Trainings, registered models, the champion's history
    and privacy records are kept."""
    from pathlib import Path

    from common.errors import FedaucError
    from pipelines.prefect_env import configure_prefect_env

    configure_prefect_env()
    from pipelines import retention, tracking

    try:
        lines = retention.prune_centre(tracking.configure(), older_than_days or retention.RETENTION_DAYS, dry_run,
                                       backend_store_uri, [Path(k) for k in kit or ()],
                                       [Path(w) for w in flare_workspace or ()])
    except FedaucError as err:
        fail(err)
    for line in lines:
        typer.echo(line)
    typer.echo("dry run: nothing was removed" if dry_run else "pruned")
