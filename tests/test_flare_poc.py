"""A real consortium on this machine (federated/flare/centre/poc.py): kits from our provisioning, a server and three
hospital clients as their own processes, mutual TLS on a port chosen free at start, trainings submitted
with the admin's kit (``ProdEnv``, as against a real consortium). The session's consortium (``melanoma_consortium``,
tests/conftest.py), shared with tests/test_flare_live.py and tests/test_flare_site_lifetime.py.

(a) two rounds of CODASCA give the model NVFlare's simulator gives (max abs difference <= 1e-5), while
(b) a client holding another consortium's kit dials the server during the job and is not admitted, and the
server refuses a TLS client certificate from another CA outright; (d) ``fedauc train --flare-env prod --kit
<admin kit>`` with no shards at the submitting machine records in MLflow what an in-process training with every shard at hand records
(the sites report their shard hashes, QC summaries and model input; the pooled ROC comes from their summed
histograms); (e) with secure aggregation the sites sign their keys with their kits and check the others'
against the root CA, and the model is the in-process one bit for bit; (f) ``fedauc evaluate --flare-env prod``
of the registered models, still with no shards there, logs what the in-process evaluation logs.
A site killed mid-job, live records and resume: tests/test_flare_live.py.
"""

from __future__ import annotations

import shutil
import socket
import ssl

import mlflow
import pytest
import torch
from mlflow import MlflowClient
from typer.testing import CliRunner

import federated
from federated.flare.centre.job import train_flare
from federated.flare.centre.poc import LocalConsortium, connected_sites
from federated.flare.centre.provision import project, provision
from federated.flare.site.start import client_command, read_kit
from federated.sites import federation_config
from pipelines.cli import app
from pipelines.prefect_env import configure_prefect_env
from preprocessing.federation import load_federation
from preprocessing.shard_format import shard_content_hash

# Prefect sets up its console logging once per process, on the stream stderr is at its first import: here,
# not inside the first `fedauc train` a CliRunner captures (whose closed stream later commands would log to).
configure_prefect_env()
from pipelines import flows  # noqa: E402,F401

pytestmark = pytest.mark.slow

SITES = ["barcelona", "new-york", "vienna"]
TIMEOUT_S = 20.0  # the collective timeout: a site silent this long fails the job
SETTINGS = dict(algorithm="codasca", params={"T0": 8}, network="small_resnet", network_kwargs={"widths": [8, 16, 32]},
                rounds=2, local_steps=8, batch_size=32, lr=1.0, guarantee_positives=True, eval_every=1,
                progress=False, loader_workers=0, timeout_s=TIMEOUT_S, device="cpu")


@pytest.fixture(scope="module")
def consortium(poc_slot, melanoma_consortium, shared_prefect):
    # A job submitted as to a real consortium leaves torch's thread count to each hospital (its own default):
    # one thread here (the shared consortium's), as this process computes, for the bit-for-bit comparisons.
    return melanoma_consortium


def _foreign_kit(consortium: LocalConsortium, folder) -> object:
    """Site 'mallory' of another consortium (its own root CA) whose kit dials our server's address."""
    spec = project(consortium.federation, "localhost", consortium.port)
    spec["name"] = "elsewhere"
    spec["participants"] = [p for p in spec["participants"] if p["type"] != "client"] + [
        {"name": "mallory", "type": "client", "org": "mallory"}]
    return provision(spec, folder).sites["mallory"]


def _tls_verdict(consortium: LocalConsortium, kit) -> str:
    """Open a TLS connection to the server with ``kit``'s client certificate, trusting the consortium's root
    CA; "admitted" when the server keeps it open (a site's certificate), else how the server ended it."""
    context = ssl.create_default_context(cafile=str(consortium.kits.server / "startup" / "rootCA.pem"))
    context.check_hostname = False
    context.load_cert_chain(kit / "startup" / "client.crt", kit / "startup" / "client.key")
    with socket.create_connection(("localhost", consortium.port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname="localhost") as tls:
        tls.settimeout(3.0)
        try:
            tls.recv(1)  # TLS 1.3: the server checks the client's certificate after the handshake returns here
        except TimeoutError:
            return "admitted"
        except (ssl.SSLError, ConnectionError) as err:
            return f"refused: {err}"
    return "refused: closed by the server"


def test_training_equals_the_simulator_and_a_foreign_client_is_refused(consortium, melanoma_shards, tmp_path):
    root, federation = melanoma_shards
    assert connected_sites(consortium.kits.admin) == SITES
    mallory = _foreign_kit(consortium, tmp_path / "elsewhere")
    # The server refuses another CA's client certificate in the handshake, and admits its own sites'.
    assert _tls_verdict(consortium, consortium.kits.sites["vienna"]) == "admitted"
    forged = tmp_path / "forged"  # mallory's certificate and key in a copy of vienna's kit
    shutil.copytree(consortium.kits.sites["vienna"], forged)
    for name in ("client.crt", "client.key"):
        shutil.copy(mallory / "startup" / name, forged / "startup" / name)
    verdict = _tls_verdict(consortium, forged)
    assert verdict.startswith("refused"), verdict

    # A whole NVFlare client from the other consortium dials the server while the training runs.
    consortium.launch("mallory", client_command(read_kit(mallory)), mallory)
    config = federation_config(load_federation(federation), root / "shards", SETTINGS)
    # The production path: the admin's kit, nothing read from this machine's shards.
    result = train_flare(config, load_federation(federation), None, "prod", tmp_path / "submit",
                         kit=consortium.kits.admin, name="poc-equals-sim")
    assert connected_sites(consortium.kits.admin) == SITES
    consortium.kill("mallory")
    assert f"Cannot connect to host localhost:{consortium.port}" in (mallory / "log.txt").read_text()  # it tried

    simulated = train_flare(config, load_federation(federation), root / "shards", "sim", tmp_path / "sim",
                            name="poc-reference")
    assert result.global_state.keys() == simulated.global_state.keys()
    worst = max((result.global_state[k].float() - v.float()).abs().max().item()
                for k, v in simulated.global_state.items())
    assert worst <= 1e-5
    assert [r["bytes_sent"] for r in result.history] == [r["bytes_sent"] for r in simulated.history]


def _records(client: MlflowClient, run_id: str) -> dict:
    """What MLflow holds of one training: the parent's params and metric names, its artifacts and QC
    summaries, and per site (by name) its child run's metric names and data-given values (counts, bytes)."""
    parent = client.get_run(run_id)
    children = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{run_id}'")
    exact = ("n_pos", "n_neg", "bytes_")

    def given(metrics):  # what the data and the declared exchange fix, whatever the arithmetic's threads
        return {k: v for k, v in metrics.items() if any(part in k for part in exact) and "bound" not in k}

    return {
        "params": {k: v for k, v in parent.data.params.items()
                   if k not in ("flare_env", "code_version", "timeout_s", "backend")},
        "metrics": sorted(parent.data.metrics),
        "given": given(parent.data.metrics),
        "artifacts": sorted(a.path for a in client.list_artifacts(run_id)),
        "qc": {site: mlflow.artifacts.load_dict(f"{parent.info.artifact_uri}/qc/{site}/summary.json")
               for site in SITES},
        "children": {c.data.tags["site"]: (sorted(c.data.metrics), given(c.data.metrics),
                                           sorted(a.path for a in client.list_artifacts(c.info.run_id, "qc")))
                     for c in children},
        "status": (parent.info.status, sorted(c.info.status for c in children)),
    }


def test_the_centre_records_a_consortium_training_without_any_shard(consortium, melanoma_shards, tmp_path,
                                                                    monkeypatch):
    """``--flare-env prod`` with an empty shards folder at the submitting machine: every site reports its
    shard hash, QC summary and model input, and MLflow holds the records an in-process training of the same
    config writes with every shard at hand: same params (shard hashes included), metrics, per-site child
    runs, QC summaries, pooled test ROC, a registered model."""
    root, federation = melanoma_shards
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlruns.db'}")
    empty = tmp_path / "no-shards-here"
    empty.mkdir()
    common = ["train", "--federation", str(federation), "--algorithm", "codasca", "-p", "T0=4", "--rounds", "1",
              "--local-steps", "2", "--batch-size", "16", "--eval-every", "1", "--site-timeout", f"{TIMEOUT_S:g}",
              "--run-name", "at-the-hospitals", "--checkpoint-dir", str(tmp_path / "checkpoints")]
    try:
        consortium_run = CliRunner().invoke(app, [
            *common, "--shards", str(empty),
            "--backend", "flare", "--flare-env", "prod", "--kit", str(consortium.kits.admin),
            "--flare-workspace", str(tmp_path / "flare")])
        assert consortium_run.exit_code == 0, consortium_run.output
        assert list(empty.iterdir()) == []
        local_run = CliRunner().invoke(app, [*common, "--shards", str(root / "shards")])
        assert local_run.exit_code == 0, local_run.output
        client = MlflowClient()
        parents = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                     "tags.fedauc_role = 'federated-training'", order_by=["attributes.start_time ASC"])
        assert len(parents) == 2
        flared, local = (_records(client, run.info.run_id) for run in parents)
        assert flared == local
        assert flared["status"] == ("FINISHED", ["FINISHED"] * 3)
        assert "roc_test_pooled.png" in flared["artifacts"] and "test/pooled/auc_macro" in flared["metrics"]
        for site in SITES:
            assert flared["params"][f"shard_hash.{site}"] == shard_content_hash(root / "shards" / site)
            assert {"test/auc_macro", "bytes_sent"} <= set(flared["children"][site][0])
        assert client.get_run(parents[0].info.run_id).data.params["flare_env"] == "prod"
        assert [client.get_run(r.info.run_id).data.params["backend"] for r in parents] == ["flare", "inprocess"]
        assert sorted(int(v.version) for v in client.search_model_versions()) == [1, 2]
        _evaluation_at_the_hospitals_equals_the_in_process_one(consortium, melanoma_shards, tmp_path, monkeypatch)
    finally:
        mlflow.set_tracking_uri(None)


def _evaluation_at_the_hospitals_equals_the_in_process_one(consortium, melanoma_shards, tmp_path, monkeypatch):
    """(f) ``fedauc evaluate --flare-env prod`` of both registered versions, from a folder without shards and
    with FEDAUC_SHARDS pointing nowhere (a fallback to a shard folder would fail): each site scores them on
    its own splits, and the centre logs what the in-process evaluation with every shard at hand logs."""
    root, federation = melanoma_shards
    versions = ["--model-version", "1", "--model-version", "2"]
    centre = tmp_path / "centre-without-shards"
    centre.mkdir()
    monkeypatch.chdir(centre)
    monkeypatch.setenv("FEDAUC_SHARDS", str(tmp_path / "nowhere"))
    remote = CliRunner().invoke(app, ["evaluate", "--federation", str(federation), *versions, "--backend", "flare",
                                      "--flare-env", "prod", "--kit", str(consortium.kits.admin),
                                      "--flare-workspace", str(tmp_path / "flare-evaluate")])
    assert remote.exit_code == 0, remote.output
    assert not (tmp_path / "nowhere").exists() and not (centre / "shards").exists()
    local = CliRunner().invoke(app, ["evaluate", "--federation", str(federation), *versions,
                                     "--shards", str(root / "shards")])
    assert local.exit_code == 0, local.output
    client = MlflowClient()
    runs = {(r.data.params["backend"], r.data.tags["model_version"]): r for r in client.search_runs(
        [e.experiment_id for e in client.search_experiments()], "tags.fedauc_role = 'evaluation'")}
    assert sorted(runs) == [("flare", "1"), ("flare", "2"), ("inprocess", "1"), ("inprocess", "2")]
    for version in ("1", "2"):
        theirs, mine = runs["flare", version], runs["inprocess", version]
        assert theirs.data.params["flare_env"] == "prod"
        assert theirs.data.params["evaluation"] == mine.data.params["evaluation"]  # same sites, same shards
        assert theirs.data.metrics.keys() == mine.data.metrics.keys()
        for key, value in mine.data.metrics.items():
            if "/n_pos/" in key or "/n_neg/" in key:
                assert theirs.data.metrics[key] == value, key
            # Each hospital computes with its own thread count under prod: the scores' last bits may differ.
            assert theirs.data.metrics[key] == pytest.approx(value, abs=1e-6, nan_ok=True), key


def test_secure_aggregation_on_the_consortium_signs_keys_with_the_kits_and_trains_the_in_process_model(
        consortium, melanoma_shards, tmp_path):
    """(e) With secure aggregation each hospital signs its X25519 key with its kit and checks the others'
    against its own root CA (its log says so), and the model is the in-process one bit for bit."""
    root, federation = melanoma_shards
    config = federation_config(load_federation(federation), root / "shards",
                               {**SETTINGS, "rounds": 1, "secure_aggregation": True})
    result = train_flare(config, load_federation(federation), None, "prod", tmp_path / "submit",
                         kit=consortium.kits.admin, name="poc-secure")
    local = federated.train(config)
    for key, value in local.global_state.items():
        assert torch.equal(result.global_state[key], value), key
    for site in SITES:
        logs = "".join(p.read_text(errors="replace") for p in consortium.kits.sites[site].rglob("log.txt"))
        assert "the public keys of 3 sites verified against the consortium's root CA" in logs, site
