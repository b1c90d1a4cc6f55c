"""Prefect flow-run and task-run names from their parameters ("train chest-xray codasca", "preprocess hanoi"),
instead of Prefect's random names ("sassy-otter", "train-af8"), so that a run list reads as what ran where.
Prefect calls these when it creates the run; they read the run's parameters and never fail the run (an
unreadable federation file is named by its file name: the flow itself reports the error)."""

from __future__ import annotations

from pathlib import Path

from prefect.runtime import flow_run, task_run

from preprocessing.federation import load_federation

FLOW_RUN_PLACEHOLDER = "{flow_run}"  # in a scheduled training's run_name: each run's own


def with_flow_run(run_name: str) -> str:
    """``run_name`` with ``{flow_run}`` replaced by this flow run's short id (its first 8 hex digits)."""
    return run_name.replace(FLOW_RUN_PLACEHOLDER, str(flow_run.get_id())[:8])


def _parameters() -> dict:
    return task_run.parameters if task_run.get_id() else flow_run.parameters


def _task(federation_yaml: str) -> str:
    try:
        return load_federation(federation_yaml).task
    except Exception:  # named only: the flow reports the file's problem itself
        return Path(federation_yaml).stem


def training() -> str:
    parameters = _parameters()
    name = parameters.get("run_name") or parameters["config"]["algorithm"]
    return f"train {_task(parameters['federation_yaml'])} {with_flow_run(name)}"


def evaluation() -> str:
    parameters = _parameters()
    versions = parameters.get("model_versions")
    return f"evaluate {_task(parameters['federation_yaml'])} {'v' + ',v'.join(versions) if versions else 'champion'}"


def comparison() -> str:
    return f"compare {_task(_parameters()['federation_yaml'])}"


def federation_data() -> str:
    parameters = _parameters()
    return f"data {_task(parameters['federation_yaml'])}"


def site_step(step: str, parameter: str = "site_yaml"):
    """The namer of a run over one site's YAML (or name): "<step> <site>" (the YAML's stem, the site's name in
    fedauc's layouts; never its folder, which stays at the site)."""
    return lambda: f"{step} {Path(_parameters()[parameter]).stem}"
