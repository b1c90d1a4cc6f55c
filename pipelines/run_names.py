"""Prefect flow-run and task-run names from their parameters ("train chest-xray codasca", "preprocess hanoi"),
instead of Prefect's random names ("sassy-otter", "train-af8"), so that a run list reads as what ran where.

Each namer reads the parameters of the run it names, never of whichever run is in context: a flow called
inside a task (the demo's data task onboards its sites) runs with that task's run context still set
(Prefect 3.8, PrefectHQ/prefect#19449), so ``prefect.runtime.task_run`` there answers for the caller. A task
namer takes ``parameters`` (Prefect passes the task run's own); a flow namer (``of_flow``) reads the flow run
context that Prefect enters for the flow it names. They never fail the run: an unreadable federation file is
named by its file name, and the flow itself reports the error."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from prefect.runtime import flow_run

from preprocessing.federation import load_federation

FLOW_RUN_PLACEHOLDER = "{flow_run}"  # in a scheduled training's run_name: each run's own

Namer = Callable[[dict], str]


def with_flow_run(run_name: str) -> str:
    """``run_name`` with ``{flow_run}`` replaced by this flow run's short id (its first 8 hex digits)."""
    return run_name.replace(FLOW_RUN_PLACEHOLDER, str(flow_run.get_id())[:8])


def of_flow(namer: Namer) -> Callable[[], str]:
    """A flow's ``flow_run_name``: ``namer`` over the parameters of the flow run being named."""
    return lambda: namer(flow_run.parameters)


def _task(federation_yaml: str) -> str:
    try:
        return load_federation(federation_yaml).task
    except Exception:  # named only: the flow reports the file's problem itself
        return Path(federation_yaml).stem


def training(parameters: dict) -> str:
    config = parameters["config"]
    name = parameters.get("run_name") or (config["algorithm"] if isinstance(config, dict) else config.algorithm)
    return f"train {_task(parameters['federation_yaml'])} {with_flow_run(name)}"


def evaluation(parameters: dict) -> str:
    versions = parameters.get("model_versions")
    return f"evaluate {_task(parameters['federation_yaml'])} {'v' + ',v'.join(versions) if versions else 'champion'}"


def comparison(parameters: dict) -> str:
    return f"compare {_task(parameters['federation_yaml'])}"


def federation_data(parameters: dict) -> str:
    return f"data {_task(parameters['federation_yaml'])}"


def site_step(step: str, parameter: str = "site_yaml") -> Namer:
    """The namer of a run over one site's YAML (or name): "<step> <site>" (the YAML's stem, the site's name in
    fedauc's layouts; never its folder, which stays at the site)."""

    def name(parameters: dict) -> str:
        return f"{step} {Path(parameters[parameter]).stem}"

    return name
