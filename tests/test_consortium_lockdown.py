"""The consortium's trust boundary on disk (federated/flare/lockdown.py), on a provisioned consortium: every
secret owner-only, the provisioned and the hospitals' authorization policies as NVIDIA FLARE itself
evaluates them, the server's stores in its own workspace, no live log upload, and kits whose private key
others can read refused at the server and at a hospital."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from nvflare.fuel.sec.authz import AuthzContext, Person
from nvflare.security.security import COMMAND_CATEGORIES, FLAuthorizer

from common.errors import ConfigError
from federated.flare.centre.provision import project, provision
from federated.flare.lockdown import ADMIN_RIGHTS, SERVER_RIGHTS, STORES
from federated.flare.server.start import prepare_server
from federated.flare.site.start import prepare_site
from preprocessing.federation import load_federation

# Every right NVFlare 2.9 checks: the commands of its categories and the rights outside them.
ALL_RIGHTS = sorted({*COMMAND_CATEGORIES, "submit_job", "clone_job", "byoc", "server-predeployed-flwr"})
SHELL = ("ls", "cat", "grep", "head", "tail", "pwd")


@pytest.fixture(scope="module")
def kits(melanoma_shards, tmp_path_factory):
    _, federation = melanoma_shards
    return provision(project(load_federation(federation), "localhost", 8002), tmp_path_factory.mktemp("kits"))


def _granted(policy_file: Path, role: str) -> set[str]:
    authorizer = FLAuthorizer("coordinating_centre", json.loads(policy_file.read_text()))
    user = Person("admin@fedauc.org", "coordinating_centre", role)
    return {right for right in ALL_RIGHTS if authorizer.authorize(AuthzContext(right, user, user))[0]}


def test_every_secret_is_owner_only_and_the_summary_keeps_the_state_with_the_admin(kits):
    consortium = kits.server.parent.parent
    assert stat.S_IMODE(consortium.stat().st_mode) == 0o700
    for path in [consortium, *consortium.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode & 0o077 == 0, f"{path} is mode {mode:04o}"
        if path.is_dir():
            assert mode == 0o700, path
    keys = [kits.state / "cert.json", *consortium.rglob("*.key")]
    assert len(keys) == 1 + 1 + len(kits.sites) + 1  # the state, the server, each hospital, the admin
    assert all(stat.S_IMODE(key.stat().st_mode) == 0o600 for key in keys)
    assert stat.S_IMODE(kits.project_file.stat().st_mode) == 0o600
    assert f"Never send `{kits.state}` anywhere: it stays with the project admin." in kits.summary("localhost", 8002)


def test_the_provisioned_policy_lets_the_project_admin_run_jobs_and_nothing_else(kits):
    for kit in (kits.server, *kits.sites.values()):
        policy = kit / "local" / "authorization.json.default"
        assert _granted(policy, "project_admin") == set(ADMIN_RIGHTS) | (set(SERVER_RIGHTS) if kit == kits.server
                                                                         else set())
        for role in ("org_admin", "lead", "member"):
            assert _granted(policy, role) == set()


def test_the_server_keeps_its_stores_in_its_own_workspace_and_takes_no_site_logs(kits):
    resources = json.loads((kits.server / "local" / "resources.json").read_text())
    stores = kits.server / STORES
    component = {c["id"]: c for c in resources["components"]}
    assert component["job_manager"]["args"]["uri_root"] == str(stores / "jobs")
    assert resources["snapshot_persistor"]["args"]["storage"]["args"]["root_dir"] == str(stores / "snapshots")
    assert not any(c["path"].endswith("JobLogReceiver") for c in resources["components"])
    assert "/tmp/nvflare" not in json.dumps(resources)
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o700 for p in (stores, stores / "jobs", stores / "snapshots"))
    for kit in kits.sites.values():
        assert json.loads((kit / "local" / "resources.json.default").read_text())["allow_log_streaming"] is False


def test_a_hospital_installs_its_own_policy_refusing_shell_commands_and_custom_code(kits, melanoma_shards):
    root, _ = melanoma_shards
    kit = kits.sites["vienna"]
    prepare_site(kit, root / "vienna.yaml", root / "shards", check_server=False)
    granted = _granted(kit / "local" / "authorization.json", "project_admin")
    assert granted == set(ADMIN_RIGHTS)
    assert not granted & {*SHELL, "byoc"}
    local = json.loads((kit / "local" / "resources.json").read_text())
    assert local["allow_log_streaming"] is False
    for name in ("authorization.json", "resources.json", "fedauc_site.json"):
        assert stat.S_IMODE((kit / "local" / name).stat().st_mode) == 0o600


@pytest.mark.parametrize("who", ["server", "vienna"])
def test_a_kit_whose_private_key_others_can_read_is_refused(kits, melanoma_shards, who):
    root, _ = melanoma_shards
    kit = kits.server if who == "server" else kits.sites[who]
    key = kit / "startup" / ("server.key" if who == "server" else "client.key")
    start = (lambda: prepare_server(kit)) if who == "server" else (
        lambda: prepare_site(kit, root / f"{who}.yaml", root / "shards", check_server=False))
    start()  # owner-only as provisioned: accepted
    key.chmod(0o644)
    try:
        with pytest.raises(ConfigError, match=r"private key readable by others \(mode 0644\)") as refused:
            start()
        assert refused.value.fix.startswith(f"chmod 600 {key}")
    finally:
        key.chmod(0o600)


def test_no_server_fedauc_starts_and_no_fedauc_process_sends_telemetry():
    import os
    import subprocess
    import sys

    from pipelines.servers import ui_servers

    for server in ui_servers(5001, 4201).values():
        env = server.env
        assert env["MLFLOW_DISABLE_TELEMETRY"] == "true" and env["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"
    # A fedauc process outside any CI or test environment (where MLflow turns telemetry off by itself).
    clean = {k: v for k, v in os.environ.items()
             if k not in ("CI", "DO_NOT_TRACK", "MLFLOW_DISABLE_TELEMETRY", "PREFECT_SERVER_ANALYTICS_ENABLED")
             and not k.startswith(("PYTEST", "GITHUB", "BUILD"))}
    probe = ("from pipelines.prefect_env import configure_prefect_env; configure_prefect_env()\n"
             "from mlflow.telemetry import utils\n"
             "import prefect.settings as s\n"
             "print(utils._IS_IN_CI_ENV_OR_TESTING, utils.is_telemetry_disabled(), "
             "s.PREFECT_SERVER_ANALYTICS_ENABLED.value())")
    done = subprocess.run([sys.executable, "-c", probe], env=clean, capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[1], check=True)
    assert done.stdout.split() == ["False", "True", "False"], done.stdout + done.stderr


def test_start_server_refuses_a_readable_key_in_one_message_with_the_fix(kits):
    from typer.testing import CliRunner

    from pipelines.cli import app

    key = kits.server / "startup" / "server.key"
    key.chmod(0o640)
    try:
        result = CliRunner().invoke(app, ["consortium", "start-server", str(kits.server)])
    finally:
        key.chmod(0o600)
    assert result.exit_code != 0
    assert f"{key}: private key readable by others (mode 0640)" in result.output
    assert f"chmod 600 {key}" in result.output and "Traceback" not in result.output
