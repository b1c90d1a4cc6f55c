"""``fedauc demo``, ``fedauc ui`` and ``fedauc deploy``: the commands that run, show or register the whole
stack (the demo job, the MLflow and Prefect UIs, the Prefect deployments)."""

from __future__ import annotations

import os

import typer

from pipelines.cli.application import fail, flows, quiet_prefect_user_errors


def demo(
    scale: float = typer.Option(1.0, "--scale", min=0.01, help="Multiply every demo hospital's size."),
    rounds: int = typer.Option(None, "--rounds", min=1, help="Override the demo's communication rounds."),
) -> None:
    """The main job on the embedded default: synthetic hospitals -> shards -> FedAvg and AUC methods on both
    tasks -> MLflow -> comparison tables with 95 % intervals, and the seconds each stage took."""
    from pipelines.prefect_env import boot_ephemeral_server, configure_prefect_env

    configure_prefect_env()
    booting = boot_ephemeral_server()  # while the flows, torch and MLflow are imported
    flows()
    from pipelines.demo import demo as demo_flow
    from pipelines.demo import demo_data
    from pipelines.schedule import profile_markdown
    from pipelines.tracking import configure

    if booting is not None:
        booting.join()
    result = demo_flow(scale=scale, rounds=rounds)
    typer.echo(result["tables"])
    typer.echo(f"Where the time went:\n\n{profile_markdown(result['profile'])}")
    typer.echo(f"MLflow runs and the registered champions: {configure()}  (browse them with `{ui_command()}`)")
    typer.echo(f"Shards and QC reports: {os.path.relpath(demo_data() / 'shards')}/<site>/qc/report.md")


def ui_command() -> str:
    """How to open this fedauc folder's UIs: with its $FEDAUC_HOME when one is set."""
    from pipelines.store_uri import HOME_ENV

    return f"{HOME_ENV}={os.environ[HOME_ENV]} fedauc ui" if os.environ.get(HOME_ENV) else "fedauc ui"


def ui(
    mlflow_port: int = typer.Option(5000, "--mlflow-port"),
    prefect_port: int = typer.Option(4200, "--prefect-port"),
) -> None:
    """Start the MLflow UI and the Prefect UI on localhost, print their URLs and, per task, the links that answer
    which method won and which version is champion (its trainings best first, the champion's version page, its
    Prefect flow runs); stop both on Ctrl-C."""
    from pipelines.prefect_env import configure_prefect_env
    from pipelines.servers import serve_uis

    configure_prefect_env()
    serve_uis(mlflow_port, prefect_port, echo=typer.echo)


def deploy(
    prefect_file: str = typer.Option("infra/prefect.yaml", "--prefect-file", help="The Prefect project file."),
    role: str = typer.Option(None, "--role", help="centre (the central pool's, demo-only ones aside), hospital "
                             "(with --site: the pool site-NAME's), or demo (all)."),
    site: str = typer.Option(None, "--site", help="With --role hospital: the hospital's site name."),
    name: list[str] = typer.Option([], "--name", help="A deployment to register (repeatable), instead of a role."),
    schedules_active: bool = typer.Option(False, "--schedules-active",
                                          help="Register schedules active (default: paused, started in the UI)."),
) -> None:
    """Register the deployments of one role (or those named) of PREFECT_FILE with the Prefect server at
    PREFECT_API_URL, creating the work pools they name first; all or nothing (what this command created is
    removed again on failure). Schedules are registered paused unless --schedules-active."""
    from pipelines.prefect_env import configure_prefect_env

    configure_prefect_env()
    from common.errors import FedaucError
    from pipelines.deploy import deploy as deploy_all

    quiet_prefect_user_errors()
    try:
        result = deploy_all(prefect_file, echo=typer.echo, role=role, site=site, names=tuple(name),
                            schedules_active=schedules_active)
    except FedaucError as err:
        fail(err)
    typer.echo(f"registered {len(result.deployments)} deployments: {', '.join(result.deployments)}")
