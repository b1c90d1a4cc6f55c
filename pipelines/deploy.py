"""``fedauc deploy``: register the deployments of one role (or those named) of a Prefect project file, all or none.

A consortium's operator registers the centre's deployments at the centre and one hospital's with that
hospital's (``select``: by work pool, ``fedauc-central`` or ``site-<name>``; the centre's ``demo-only``
ones, which read every hospital's shards in one process, only when asked for by name or role ``demo``), and
every schedule is registered paused unless ``schedules_active``: a registration starts nothing.

``prefect deploy --all`` stops at the first deployment whose work pool does not exist, leaving the ones
before it registered (6 of 17 in a consortium that forgot one pool). Here the file is checked first
(every deployment names a pool, its entrypoint loads, its parameters fit the flow), every missing pool is
created, and only then is ``prefect deploy`` run; if it still fails, the deployments and pools this command
created are removed again, so the server is left as it was. Generic over the file: whatever deployments and
pools it declares. Import after ``pipelines.prefect_env.configure_prefect_env()``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from common.errors import ConfigError, FedaucError
from pipelines.prefect_env import PROJECT_ROOT

WORK_POOL_TYPE = "process"
CENTRE_POOL = "fedauc-central"
DEMO_ONLY = "demo-only"  # the tag of deployments that read every hospital's shards at the centre
ROLES = ("centre", "hospital", "demo")


def select(deployments: list[dict], role: str | None = None, site: str | None = None,
           names: tuple[str, ...] = ()) -> list[dict]:
    """The deployments of ``role`` (``centre``: the central pool's but the demo-only ones; ``hospital``: the
    pool ``site-<site>``'s; ``demo``: all), or those ``names``; one of the two must be given."""
    if bool(role) == bool(names):
        raise ConfigError("say what to register: --role centre, --role hospital --site NAME, --role demo, or "
                          "--name DEPLOYMENT (repeatable)")
    if names:
        unknown = sorted(set(names) - {d["name"] for d in deployments})
        if unknown:
            raise ConfigError(f"no such deployment(s): {', '.join(unknown)}",
                              fix=f"one of: {', '.join(d['name'] for d in deployments)}")
        return [d for d in deployments if d["name"] in names]
    if role not in ROLES:
        raise ConfigError(f"--role {role!r}: one of {', '.join(ROLES)}")
    if (role == "hospital") != bool(site):
        raise ConfigError("--site NAME goes with --role hospital (and only with it)")
    if role == "demo":
        return list(deployments)
    if role == "centre":
        return [d for d in deployments
                if d["work_pool"]["name"] == CENTRE_POOL and DEMO_ONLY not in (d.get("tags") or [])]
    chosen = [d for d in deployments if d["work_pool"]["name"] == f"site-{site}"]
    if not chosen:
        raise ConfigError(f"no deployment in work pool site-{site}",
                          fix=f"add onboard-{site}, preprocess-{site} and client-{site} to the Prefect project file")
    return chosen


def paused(deployments: list[dict], schedules_active: bool = False) -> list[dict]:
    """The deployments with every schedule ``active: false`` unless ``schedules_active``."""
    return [{**d, "schedules": [{**schedule, "active": schedules_active} for schedule in d.get("schedules") or []]}
            for d in deployments]


@dataclass
class DeployResult:
    deployments: list[str]  # "<flow name>/<deployment name>", sorted
    created_pools: list[str] = field(default_factory=list)


def read_deployments(prefect_file: Path) -> list[dict]:
    """The file's deployments; each must have a name, an entrypoint and a work pool."""
    try:
        spec = yaml.safe_load(Path(prefect_file).read_text())
    except FileNotFoundError:
        raise ConfigError(f"{prefect_file}: Prefect project file not found",
                          fix="pass --prefect-file with the path of your prefect.yaml") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{prefect_file}: malformed YAML: {err}") from None
    deployments = (spec or {}).get("deployments") or []
    if not deployments:
        raise ConfigError(f"{prefect_file}: no deployments declared")
    problems = []
    for index, deployment in enumerate(deployments):
        label = deployment.get("name") or f"deployments.{index}"
        for key in ("name", "entrypoint"):
            if not deployment.get(key):
                problems.append(f"{label}: {key} is missing")
        if not (deployment.get("work_pool") or {}).get("name"):
            problems.append(f"{label}: work_pool.name is missing")
    if problems:
        raise ConfigError(f"{prefect_file}: " + "; ".join(problems),
                          fix="give every deployment a name, an entrypoint and work_pool: {name: ...}")
    return deployments


def check_entrypoints(deployments: list[dict], project_root: Path = PROJECT_ROOT) -> None:
    """Load every entrypoint's flow and validate the deployment's parameters against it, a training's ``config``
    as its flow run will (``federated.sites.training_settings``), before anything is registered: a typo would
    otherwise fail half-way through ``prefect deploy``, or at the first scheduled run."""
    from prefect.flows import load_flow_from_entrypoint

    from federated.sites import training_settings

    problems = []
    for deployment in deployments:
        path, _, name = deployment["entrypoint"].partition(":")
        parameters = deployment.get("parameters") or {}
        try:
            flow = load_flow_from_entrypoint(f"{project_root / path}:{name}")
            flow.validate_parameters(parameters)
            if name == "train_federated":
                training_settings(parameters["config"])
        except Exception as err:  # any failure to load or validate is reported, per deployment
            problems.append(f"{deployment['name']} ({deployment['entrypoint']}): {str(err).splitlines()[0]}")
    if problems:
        raise ConfigError("deployments that cannot be registered:\n  " + "\n  ".join(problems),
                          fix="correct the entrypoints or parameters in the Prefect project file; nothing was deployed")


def _ensure_pools(client, pools: list[str]) -> list[str]:
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound
    from prefect.workers.process import ProcessWorker

    created = []
    for pool in pools:
        try:
            client.read_work_pool(pool)
        except ObjectNotFound:
            client.create_work_pool(WorkPoolCreate(name=pool, type=WORK_POOL_TYPE,
                                                   base_job_template=ProcessWorker.get_default_base_job_template()))
            created.append(pool)
    return created


def _deployment_names(client) -> set[str]:
    flows = {f.id: f.name for f in client.read_flows()}
    return {f"{flows.get(d.flow_id, '?')}/{d.name}" for d in client.read_deployments()}


def deploy(prefect_file: str | Path, project_root: Path = PROJECT_ROOT, echo: Callable[[str], None] = print,
           role: str | None = None, site: str | None = None, names: tuple[str, ...] = (),
           schedules_active: bool = False) -> DeployResult:
    """Create the missing work pools of the deployments ``select`` picks, then register them (schedules
    paused unless ``schedules_active``) with the server that PREFECT_API_URL points at; on failure undo what
    this call created and raise a FedaucError."""
    import tempfile

    from prefect import get_client

    prefect_file = Path(prefect_file).resolve()
    deployments = paused(select(read_deployments(prefect_file), role, site, names), schedules_active)
    pools = list(dict.fromkeys(d["work_pool"]["name"] for d in deployments))
    check_entrypoints(deployments, project_root)
    unedited = [d["name"] for d in deployments if "EDIT-ME" in yaml.safe_dump(d.get("parameters") or {})]
    if unedited:
        echo(f"not edited yet (EDIT-ME in the consortium block of {prefect_file.name}; a run would fail): "
             f"{', '.join(unedited)}")
    env = dict(os.environ)
    with get_client(sync_client=True) as client:
        before = _deployment_names(client)
        created_pools = _ensure_pools(client, pools)
        for pool in created_pools:
            echo(f"created work pool {pool} ({WORK_POOL_TYPE})")
        # The chosen deployments as a project file of their own, beside the original (its pull steps kept).
        spec = yaml.safe_load(prefect_file.read_text())
        spec.pop("definitions", None)  # its anchors are resolved in the deployments already
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", dir=prefect_file.parent, prefix=".fedauc-deploy-",
                                         delete=False) as chosen:
            yaml.safe_dump({**spec, "deployments": deployments}, chosen, sort_keys=False)
        command = [str(Path(sys.executable).parent / "prefect"), "--no-prompt", "deploy", "--all",
                   "--prefect-file", chosen.name]
        try:
            result = subprocess.run(command, cwd=project_root, env=env, capture_output=True, text=True)
        finally:
            Path(chosen.name).unlink()
        if result.returncode != 0:
            new = _deployment_names(client) - before
            for full_name in sorted(new):
                client.delete_deployment(client.read_deployment_by_name(full_name).id)
            for pool in created_pools:
                client.delete_work_pool(pool)
            tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
            raise FedaucError(
                f"`prefect deploy` failed; removed the {len(new)} deployment(s) and {len(created_pools)} work "
                f"pool(s) it had created, so the server is as before.\n{tail}",
                fix=f"correct {prefect_file} (see the message above) and run `fedauc deploy` again")
        names = {d["name"] for d in deployments}
        registered = sorted(n for n in _deployment_names(client) if n.partition("/")[2] in names)
    missing = sorted(names - {n.partition("/")[2] for n in registered})
    if missing:
        raise FedaucError(f"`prefect deploy` exited 0 but these deployments are not on the server: {missing}")
    return DeployResult(registered, created_pools)
