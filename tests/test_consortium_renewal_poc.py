"""Renewal with certificates valid for minutes keeps a consortium training, on a real one on this machine
(federated/flare/centre/poc.py: kits from our provisioning, a server and three hospital clients as their own
processes, mutual TLS). The root CA, and so every kit, is valid for a few minutes: `fedauc consortium status`
warns of each kit; a training runs; `fedauc consortium renew` re-issues every kit; every participant starts
again from its new kit, before the old ones expire. Once they have expired (a hospital on its old kit is refused
by `start-site`), a training runs again and status warns of nothing, and names the hospitals behind a fedauc
version the centre announces: tests/test_renewed_consortium_poc.py, the consortium unit's last module, so that
the other consortium modules run while the old kits expire instead of this one waiting for it (CONTRIBUTING.md
"The suite's time"); run alone, it renews a consortium itself (``renewed``) and waits."""

from __future__ import annotations

import datetime as dt

import pytest
from typer.testing import CliRunner

from federated.flare.centre.certificates import kit_expiries
from federated.flare.centre.poc import ADMIN, LocalConsortium
from federated.flare.centre.provision import project, provision, renew
from pipelines.cli import app
from preprocessing.federation import load_federation

pytestmark = pytest.mark.slow
runner = CliRunner()
# Long enough to start the consortium, train once, renew and start it again on its new kits on a loaded 2-core
# machine: that took 116 s at a load of 10, and 176 s to the end of the first training at a load of 8.
VALID = dt.timedelta(minutes=4)


def status(admin, *more: str) -> str:
    result = runner.invoke(app, ["consortium", "status", "--kit", str(admin), *more])
    assert result.exit_code == 0, result.output
    assert "3 site(s) connected" in result.output, result.output
    return result.output


def warnings(admin) -> list[str]:
    return [line for line in status(admin).splitlines() if line.startswith("warning: ")]


def training_args(federation, folder) -> list[str]:
    """`fedauc train` at the centre over the consortium (the admin's kit and a run name to add); ``folder`` holds
    no shards: the hospitals' are theirs."""
    empty = folder / "no-shards-here"
    empty.mkdir(exist_ok=True)
    return ["train", "--federation", str(federation), "--shards", str(empty), "--algorithm", "codasca", "-p", "T0=4",
            "--network", "small_resnet_gn", "--rounds", "2", "--local-steps", "2", "--batch-size", "16",
            "--eval-every", "0", "--backend", "flare", "--flare-env", "prod", "--flare-workspace", str(folder / "flare")]


def renewed(melanoma_shards, folder, trainings) -> dict:
    """A consortium on kits valid for ``VALID`` that warns of each, trains, is renewed and starts again from its
    new kits before the old ones expire; stopped again. What the test after the expiry needs: the ``consortium``
    (its ``kits`` the new ones), the ``old`` kits, when they ``expire``, the MLflow ``store`` and the ``folder``."""
    root, federation = melanoma_shards
    store = f"sqlite:///{folder / 'mlruns.db'}"
    consortium = LocalConsortium(load_federation(federation), root / "shards", folder / "poc")
    out = consortium.workspace / "kits"
    consortium.kits = provision(project(consortium.federation, "localhost", consortium.port, ADMIN), out,
                                root_valid_for=VALID)
    old = consortium.kits
    expires = max(kit_expiries(old.server.parent).values())
    try:
        consortium.start()
        warned = warnings(old.admin)
        assert len(warned) == 6 and any(line.startswith("warning: the root CA expires on ") for line in warned), warned
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("MLFLOW_TRACKING_URI", store)
            thread, before = trainings([*training_args(federation, folder), "--kit", str(old.admin),
                                        "--run-name", "before-renewal"])
            thread.join(300)
        assert before["exit_code"] == 0, before["output"]

        new = renew(out)
        consortium.stop()  # each participant stops its fedauc, puts its new kit in place and starts again
        consortium.kits = new
        consortium.start()
        assert dt.datetime.now(dt.timezone.utc) < expires, "renewal came after the old certificates expired"
    finally:
        consortium.stop()
    return {"consortium": consortium, "old": old, "expires": expires, "store": store, "folder": folder}


def test_renewal_with_minute_long_certificates_keeps_the_consortium_training(poc_slot, melanoma_shards, tmp_path,
                                                                             monkeypatch, trainings, renewal, shared_prefect):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    renewal.update(renewed(melanoma_shards, tmp_path, trainings))
