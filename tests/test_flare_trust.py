"""No code travels to a hospital (federated/flare/installed.py, federated/flare/site/version.py): a fedauc NVFlare job is
configuration only and names fedauc's installed job modules; a site refuses a job built by another fedauc
code version than its own or one its site YAML allows, in one line naming both."""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
from pathlib import Path

import pytest

from federated.flare.centre.job import recipe
from federated.flare.installed import COMPONENTS, JOB_MODULES, InstalledModule, allow_components
from federated.flare.protocol import JOB_PROP
from federated.flare.site.version import ForeignCodeVersion, check_code_version, code_version
from federated.flare.spec import FlareJob

FOREIGN = "0.0.9+gdeadbeef0000"


def _job() -> FlareJob:
    return FlareJob(settings={"algorithm": "fedavg"}, sites=["vienna", "barcelona"], task="melanoma",
                    diseases=("Melanoma",), job_timeout_s=60.0)


def _components(node) -> set[str]:
    """Every class path anywhere in a job config (components, workflows, executors, filters)."""
    if isinstance(node, list):
        return set().union(*map(_components, node)) if node else set()
    if not isinstance(node, dict):
        return set()
    found = {node[k] for k in ("path", "class_path", "name") if isinstance(node.get(k), str) and "." in node[k]}
    return found.union(*map(_components, node.values()))


def test_a_fedauc_job_folder_holds_configuration_only(tmp_path):
    recipe(_job(), "Trust test").export(str(tmp_path))
    files = [p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file()]
    assert files and not [p for p in files if p.suffix in (".py", ".pyc", ".pyi", ".so")], files
    assert not list(tmp_path.rglob("custom"))
    configs = {p.name: json.loads(p.read_text()) for p in tmp_path.rglob("config_fed_*.json")}
    assert set(configs) == {"config_fed_server.json", "config_fed_client.json"}
    # Every component a participant builds is on fedauc's allow-list, the job modules named by their import path.
    for config in configs.values():
        assert _components(config) <= set(COMPONENTS)
    modules = {c["args"]["module"] for config in configs.values() for c in config["components"]
               if c["path"] == COMPONENTS[-1]}
    assert modules == set(JOB_MODULES)
    server = configs["config_fed_server.json"]["workflows"][0]["args"]["props"][JOB_PROP]
    assert server["code_version"] == code_version()
    meta = json.loads(next(tmp_path.rglob("meta.json")).read_text())
    assert not meta.get("byoc")


def test_the_job_modules_are_the_only_modules_a_job_can_name():
    assert InstalledModule("federated.flare.site.job").module_name == "federated.flare.site.job"
    with pytest.raises(ValueError, match="not 'os'"):
        InstalledModule("os")


def test_a_site_allow_list_admits_fedaucs_components_only_and_streams_no_log(tmp_path):
    (tmp_path / "resources.json.default").write_text(json.dumps(
        {"format_version": 2, "class_allow_list": ["nvflare.app_common."], "components": [{"id": "x"}]}))
    written = json.loads(allow_components(tmp_path).read_text())
    assert written["class_allow_list"] == list(COMPONENTS)
    assert written["class_list_enforcement_mode"] == "enforce" and written["allow_log_streaming"] is False
    assert written["components"] == [{"id": "x"}]  # the kit's own settings stay


def test_the_code_version_is_the_package_version_and_the_checkout_commit():
    root = Path(__file__).resolve().parents[1]
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert code_version() == f"{importlib.metadata.version('fedauc')}+g{head[:12]}"
    assert re.fullmatch(r"\d+\.\d+\.\d+\+g[0-9a-f]{12}", code_version())


def test_a_site_refuses_a_foreign_code_version_in_one_line_unless_its_yaml_allows_it():
    check_code_version("vienna", code_version())
    check_code_version("vienna", FOREIGN, allowed=[FOREIGN])
    with pytest.raises(ForeignCodeVersion) as refused:
        check_code_version("vienna", FOREIGN, allowed=["0.0.8+g000000000000"])
    message = str(refused.value)
    assert "\n" not in message
    assert f"site 'vienna' refuses the job: it was built by fedauc {FOREIGN}, " \
           f"this site runs fedauc {code_version()}" in message
    assert "allowed_code_versions" in message


def test_a_site_failure_is_one_line_without_paths():
    from common.errors import DataError
    from federated.flare.site.failure import failure_line

    err = DataError("site 'vienna': /data/hospital/shards/vienna/train/manifest.parquet is missing "
                    "(read in C:\\fedauc\\shards and ~/shards)", fix="run `fedauc preprocess --out /data/x` again")
    line = failure_line(err)
    assert line == ("DataError: site 'vienna': <path at the site> is missing (read in <path at the site> and "
                    "<path at the site>) fix: run `fedauc preprocess --out <path at the site>` again")
    assert failure_line(ValueError("3/4 and/or 1.5/2")) == "ValueError: 3/4 and/or 1.5/2"


@pytest.mark.slow
def test_a_site_failure_reaches_the_centre_as_one_line_without_paths(tmp_path, melanoma_shards):
    """A site whose shard folder vanished after the job was built: the job fails naming the site, and the
    server (here: its log and the submitter's error) never sees the path the site's error named."""
    import shutil

    from federated.flare.centre.job import FlareJobFailed, train_flare
    from federated.sites import federation_config
    from preprocessing.federation import load_federation

    root, federation = melanoma_shards
    for name in ("vienna", "barcelona", "new-york"):
        shutil.copytree(root / "shards" / name, tmp_path / "shards" / name)
    settings = dict(algorithm="fedavg", network="small_resnet", network_kwargs={"widths": [8]}, rounds=1,
                    local_steps=1, batch_size=8, progress=False, loader_workers=0, timeout_s=60, device="cpu")
    cfg = federation_config(load_federation(federation), tmp_path / "shards", settings)
    gone = tmp_path / "shards" / "new-york" / "train" / "manifest.parquet"
    gone.unlink()
    with pytest.raises(FlareJobFailed) as failed:
        train_flare(cfg, load_federation(federation), tmp_path / "shards", "sim", tmp_path / "sim", name="test-failure")
    first = str(failed.value).splitlines()[0]
    assert "site 'new-york' failed: DataError: " in first and "<path at the site>" in first, first
    assert str(tmp_path / "shards" / "new-york") not in first
    server_log = "".join(p.read_text(errors="replace") for p in (tmp_path / "sim").rglob("server/**/log.txt"))
    assert "<path at the site>" in server_log and str(gone) not in server_log


@pytest.mark.slow
def test_a_simulated_site_refuses_a_job_from_another_code_version(tmp_path, melanoma_shards, monkeypatch):
    from federated.flare.centre.job import FlareJobFailed, train_flare
    from federated.sites import federation_config
    from preprocessing.federation import load_federation

    root, federation = melanoma_shards
    settings = dict(algorithm="fedavg", network="small_resnet", network_kwargs={"widths": [8]}, rounds=1,
                    local_steps=1, batch_size=8, progress=False, loader_workers=0, timeout_s=60, device="cpu")
    cfg = federation_config(load_federation(federation), root / "shards", settings)
    # The centre (this process) runs another fedauc than the site processes, which compute their own.
    monkeypatch.setattr("federated.flare.centre.job.code_version", lambda: FOREIGN)
    with pytest.raises(FlareJobFailed) as failed:
        train_flare(cfg, load_federation(federation), root / "shards", "sim", tmp_path / "sim", name="test-version")
    first = str(failed.value).splitlines()[0]
    assert re.search(rf"site '[a-z-]+' refuses the job: it was built by fedauc {re.escape(FOREIGN)}, this site "
                     rf"runs fedauc {re.escape(code_version())}", first), first


@pytest.mark.slow
def test_an_evaluation_site_failure_reaches_the_centre_as_one_line_without_paths(tmp_path, melanoma_shards):
    """The evaluation job's site half fails like training's: one redacted line, never NVFlare's traceback with
    the site's paths (fails where ``site.job.evaluate`` raises)."""
    import shutil

    from federated.flare.centre.evaluate import evaluate_flare
    from federated.flare.centre.job import FlareJobFailed
    from federated.network import build_named
    from federated.scoring import ModelToScore
    from preprocessing.federation import load_federation

    root, federation = melanoma_shards
    for name in ("vienna", "barcelona", "new-york"):
        shutil.copytree(root / "shards" / name, tmp_path / "shards" / name)
    gone = tmp_path / "shards" / "barcelona" / "test" / "manifest.parquet"
    gone.unlink()
    shape = (3, 32, 32)
    model = ModelToScore(label="1", network="linear", input_shape=shape, num_classes=1)
    with pytest.raises(FlareJobFailed) as failed:
        evaluate_flare([model], [build_named("linear", {}, shape, 1).state_dict()], load_federation(federation),
                       tmp_path / "shards", "sim", tmp_path / "sim", None, bins=32, min_count=10, name="test-eval-failure")
    message = str(failed.value)
    assert "site 'barcelona' failed: DataError: " in message and "<path at the site>" in message, message
    assert str(tmp_path / "shards") not in message and "Traceback" not in message
    server_log = "".join(p.read_text(errors="replace") for p in (tmp_path / "sim").rglob("server/**/log.txt"))
    assert "<path at the site>" in server_log and str(gone) not in server_log
