"""A hospital's own guard on a real consortium on this machine (one POC start for the module): its
``local/authorization.json`` (``fedauc consortium start-site``) refuses the admin's shell commands and a job
with custom code even though this consortium's centre permits both (its server and the policy in every
hospital's kit are NVIDIA FLARE's ``project_admin: any`` in place of fedauc's, so that only the sites' own
policy stands in the way); a job from another fedauc code version is refused by every site in one line naming both versions;
the job a hospital receives holds no code, and the server stores it in its own workspace."""

from __future__ import annotations

import io
import json
import re
import zipfile

import pytest

from federated.flare.centre.job import FlareJobFailed, flare_job, train_flare
from federated.flare.centre.poc import ADMIN, LocalConsortium, admin_session
from federated.flare.centre.provision import project, provision
from federated.flare.lockdown import STORES
from federated.flare.protocol import JOB_PROP
from federated.sites import federation_config
from federated.version import code_version
from preprocessing.federation import load_federation

pytestmark = pytest.mark.slow

FOREIGN = "0.0.9+gdeadbeef0000"
SETTINGS = dict(algorithm="fedavg", network="small_resnet", network_kwargs={"widths": [8]}, rounds=1, local_steps=1,
                batch_size=8, progress=False, loader_workers=0, timeout_s=20.0, device="cpu")


@pytest.fixture(scope="module")
def consortium(poc_slot, melanoma_shards, tmp_path_factory):
    root, federation = melanoma_shards
    workspace = tmp_path_factory.mktemp("trust-poc")
    local = LocalConsortium(load_federation(federation), root / "shards", workspace)
    local.kits = provision(project(local.federation, "localhost", local.port, ADMIN), workspace / "kits")
    # A centre that permits everything, at the server and in the hospitals' kits.
    anything = json.dumps({"format_version": "1.0", "permissions": {"project_admin": "any"}})
    (local.kits.server / "local" / "authorization.json").write_text(anything)
    for kit in local.kits.sites.values():
        (kit / "local" / "authorization.json.default").write_text(anything)
    with local:
        yield local


def _config(melanoma_shards):
    root, federation = melanoma_shards
    return federation_config(load_federation(federation), root / "shards", SETTINGS)


def test_the_admins_shell_commands_at_a_site_are_refused_by_the_site(consortium):
    site_file = consortium.kits.sites["vienna"] / "local" / "fedauc_site.json"
    shard_path = json.loads(site_file.read_text())["shards"]
    session = admin_session(consortium.kits.admin)
    try:
        # The server's policy permits them: its own working directory answers.
        assert session.get_working_directory("server")
        for command in (lambda: session.cat_target("vienna", file="local/fedauc_site.json"),
                        lambda: session.ls_target("vienna", path="local"),
                        lambda: session.tail_target("vienna", file="log.txt")):
            try:
                answer = str(command())
            except Exception as err:  # NVFlare's API raises AuthorizationError or answers with the refusal
                answer = f"{type(err).__name__}: {err}"
            assert "not authorized" in answer.lower(), answer
            assert shard_path not in answer and "fedauc_site" not in answer.replace("local/fedauc_site.json", "")
    finally:
        session.close()


def test_a_job_from_another_code_version_is_refused_and_no_job_carries_code(consortium, melanoma_shards,
                                                                               tmp_path, monkeypatch):
    monkeypatch.setattr("federated.flare.centre.job.code_version", lambda: FOREIGN)
    with pytest.raises(FlareJobFailed) as failed:
        train_flare(_config(melanoma_shards), consortium.federation, None, "prod", tmp_path / "submit",
                    kit=consortium.kits.admin, name="foreign")
    first = str(failed.value).splitlines()[0]
    assert re.search(rf"site '[a-z-]+' refuses the job: it was built by fedauc {re.escape(FOREIGN)}, this site "
                     rf"runs fedauc {re.escape(code_version())}", first), first
    job_id = re.search(r"NVFlare job ([0-9a-f-]{36})", first).group(1)
    # The job as the server stored it, in its own workspace, and as every hospital received it: no code.
    stored = consortium.kits.server / STORES / "jobs" / job_id
    assert stored.is_dir()
    with zipfile.ZipFile(io.BytesIO((stored / "data").read_bytes())) as job:
        names = job.namelist()
    assert any(n.endswith("config_fed_client.json") for n in names)
    assert not [n for n in names if n.endswith((".py", ".pyc", ".so")) or "/custom/" in n], names
    for name, kit in consortium.kits.sites.items():
        received = kit / job_id
        assert (received / f"app_{name}" / "config" / "config_fed_client.json").is_file()
        assert not [p for p in received.rglob("*") if p.suffix in (".py", ".pyc", ".so") or p.name == "custom"]


def test_a_job_with_custom_code_is_refused_by_every_site(consortium, melanoma_shards, tmp_path):
    from nvflare.collab import CollabRecipe

    from federated.flare.server import job as server
    from federated.flare.site import job as site

    # NVFlare's own collab recipe ships fedauc's package in the job (BYOC): the server permits it here.
    job = flare_job(_config(melanoma_shards), "melanoma", ("Melanoma",), 60.0, share_paths=False)
    byoc = CollabRecipe(job_name="byoc", server=server, client=site, min_clients=len(job.sites))
    byoc.set_server_prop(JOB_PROP, job.model_dump())
    run = byoc.run(consortium.exec_env())
    run.get_result(timeout=120.0)
    session = admin_session(consortium.kits.admin)
    try:
        meta = session.get_job_meta(run.get_job_id())
    finally:
        session.close()
    assert meta["byoc"] is True and meta["status"] == "FINISHED:FAILED_TO_RUN", meta
    details = meta["job_deploy_detail"]
    assert "server: OK" in details  # the server's policy let it through; every hospital's own did not
    for name, kit in consortium.kits.sites.items():
        assert f"{name}: NVFLARE_ERROR: BYOC not permitted" in details, details
        assert not list((kit / run.get_job_id()).rglob("*.py"))
