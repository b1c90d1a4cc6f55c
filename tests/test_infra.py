"""infra/prefect.yaml is what a consortium deploys: every deployment must point at a real flow with
parameters that flow accepts, and every site's work runs in that site's own pool."""

import importlib.util
from pathlib import Path

import pytest
import yaml

from pipelines.prefect_env import configure_prefect_env

configure_prefect_env()

from prefect import Flow  # noqa: E402

from pipelines.demo import DEMO_SCHEDULE  # noqa: E402
from preprocessing.federation import load_federation  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEPLOYMENTS = yaml.safe_load((ROOT / "infra" / "prefect.yaml").read_text())["deployments"]


def _flow(entrypoint: str) -> Flow:
    path, name = entrypoint.split(":")
    spec = importlib.util.spec_from_file_location(Path(path).stem, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


@pytest.mark.parametrize("deployment", DEPLOYMENTS, ids=[d["name"] for d in DEPLOYMENTS])
def test_deployment_points_at_a_flow_that_accepts_its_parameters(deployment):
    flow = _flow(deployment["entrypoint"])
    assert isinstance(flow, Flow)
    flow.validate_parameters(deployment.get("parameters", {}))  # raises on unknown or missing parameters
    for key, value in deployment.get("parameters", {}).items():
        if key.endswith("_yaml") and not value.startswith("EDIT-ME/"):  # EDIT-ME: the consortium's operator's to fill
            assert (ROOT / value).is_file(), f"{deployment['name']}: {key} {value} does not exist"


def test_the_centres_production_deployments_hold_no_demo_path():
    """What `fedauc deploy --role centre` registers reads the consortium block the operator edits: no demo
    federation, kit or shards; the in-process ones that read every hospital's shards are marked demo-only."""
    centre = [d for d in DEPLOYMENTS if d["work_pool"]["name"] == "fedauc-central"]
    production = [d for d in centre if "demo-only" not in d.get("tags", [])]
    assert {d["name"] for d in production} == {"consortium-chest-codasca", "consortium-melanoma-codasca",
                                               "prune-centre"}
    production = [d for d in production if d["name"] != "prune-centre"]  # it takes no federation
    for deployment in production:
        assert "demo" not in yaml.safe_dump(deployment["parameters"]), deployment["name"]
        assert deployment["parameters"]["federation_yaml"].startswith("EDIT-ME/")
        assert deployment["parameters"]["launcher"]["kit"].startswith("EDIT-ME/")
    assert all((d.get("parameters") or {}).get("launcher", {}).get("kind") != "flare" for d in centre
               if d not in production)


def test_the_centre_prunes_nightly_to_the_one_retention_default():
    """The retention period is the flow's default (pipelines/retention.py), not a second number here."""
    prune = next(d for d in DEPLOYMENTS if d["name"] == "prune-centre")
    assert prune["work_pool"]["name"] == "fedauc-central" and prune["concurrency_limit"] == 1
    assert prune["schedules"][0]["cron"] == "0 5 * * *"
    assert "older_than_days" not in (prune.get("parameters") or {})


def test_each_demo_site_preprocesses_in_its_own_pool():
    pools = {d["name"]: d["work_pool"]["name"] for d in DEPLOYMENTS}
    for federation in ("chest", "melanoma"):
        for site in load_federation(ROOT / "sites" / "demo" / f"{federation}.yaml").sites:
            assert pools[f"preprocess-{site.name}"] == f"site-{site.name}"
            assert pools[f"onboard-{site.name}"] == f"site-{site.name}"


def test_nightly_training_is_scheduled_centrally():
    nightly = next(d for d in DEPLOYMENTS if d["name"] == "nightly-chest-codasca")
    assert nightly["work_pool"]["name"] == "fedauc-central"
    assert nightly["schedules"][0]["cron"] == "0 2 * * *"


def test_training_configs_are_valid_train_configs():
    """A typo in a scheduled config would only surface at 02:00; validate it here, as the flow and `fedauc train`
    do (the federation YAML gives the sites)."""
    from federated.sites import training_settings

    for deployment in DEPLOYMENTS:
        parameters = deployment.get("parameters", {})
        if "config" in parameters:
            configs = [parameters["config"]]
        elif "base_config" in parameters:
            configs = [{**parameters["base_config"], "algorithm": a, "local_steps": i}
                       for a in parameters["algorithms"] for i in parameters["local_steps"]]
        else:
            continue
        for config in configs:
            validated = training_settings(config)
            if validated.algorithm == "codasca" and "config" in parameters:  # its demo lr goes with the schedule it was chosen under
                assert validated.params == DEMO_SCHEDULE, deployment["name"]


def test_a_deployment_with_a_bad_training_setting_is_refused_before_anything_is_registered():
    from common.errors import ConfigError
    from pipelines.deploy import check_entrypoints

    nightly = next(d for d in DEPLOYMENTS if d["name"] == "nightly-chest-codasca")
    check_entrypoints([nightly])
    parameters = nightly["parameters"]
    broken = {**nightly, "parameters": {**parameters, "config": {**parameters["config"], "lr": 0}}}
    with pytest.raises(ConfigError, match=r"nightly-chest-codasca \(pipelines/flows.py:train_federated\): "
                                          r"training config: lr: Input should be greater than 0"):
        check_entrypoints([broken])


def _unit(name: str) -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in (ROOT / "infra" / "systemd" / name).read_text().splitlines():
        key, equals, value = line.partition("=")
        if equals and not line.startswith("#"):
            settings.setdefault(key.strip(), []).extend(value.split() if key == "Environment" else [value])
    return settings


def test_the_hospitals_two_units_share_one_private_ledger_folder():
    """The worker preprocesses (writing the site's budget into its ledger), the FLARE client charges it: one
    folder, as one user, private to it."""
    units = [_unit("fedauc-prefect-worker.service"), _unit("fedauc-site.service")]
    states = [{v.partition("=")[2] for v in unit["Environment"] if v.startswith("FEDAUC_SITE_STATE=")} for unit in units]
    assert states[0] == states[1] and len(states[0]) == 1
    (state,) = states[0]
    for unit in units:
        assert unit["User"] == ["fedauc"] and unit["StateDirectoryMode"] == ["0700"]
        assert state.startswith(f"/var/lib/{unit['StateDirectory'][0]}/")
