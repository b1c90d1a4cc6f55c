"""Renewal with certificates valid for minutes keeps a consortium training, on a real one on this machine
(federated/flare/centre/poc.py: kits from our provisioning, a server and three hospital clients as their own
processes, mutual TLS). The root CA, and so every kit, is valid for a few minutes: `fedauc consortium status`
warns of each kit; a training runs; `fedauc consortium renew` re-issues every kit; every participant starts
again from its new kit; once the old certificates have expired (a hospital on its old kit is refused by
`start-site`), a training runs again and status warns of nothing, and names the hospitals behind a fedauc
version the centre announces."""

from __future__ import annotations

import datetime as dt
import time

import pytest
from typer.testing import CliRunner

from common.errors import ConfigError
from federated.flare.centre.certificates import kit_expiries
from federated.flare.centre.poc import ADMIN, LocalConsortium
from federated.flare.centre.provision import project, provision, renew
from federated.flare.site.start import check_certificate, read_kit
from federated.version import code_version
from pipelines.cli import app
from preprocessing.federation import load_federation

pytestmark = pytest.mark.slow
runner = CliRunner()
# Long enough to start the consortium and train once on this 2-core machine, short enough to wait out.
VALID = dt.timedelta(minutes=4)


def _status(admin, *more: str) -> str:
    status = runner.invoke(app, ["consortium", "status", "--kit", str(admin), *more])
    assert status.exit_code == 0, status.output
    assert "3 site(s) connected" in status.output, status.output
    return status.output


def _warnings(admin) -> list[str]:
    return [line for line in _status(admin).splitlines() if line.startswith("warning: ")]


def test_renewal_with_minute_long_certificates_keeps_the_consortium_training(poc_slot, melanoma_shards, tmp_path,
                                                                             monkeypatch, trainings):
    root, federation = melanoma_shards
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlruns.db'}")
    consortium = LocalConsortium(load_federation(federation), root / "shards", tmp_path / "poc")
    out = consortium.workspace / "kits"
    consortium.kits = provision(project(consortium.federation, "localhost", consortium.port, ADMIN), out,
                                root_valid_for=VALID)
    old = consortium.kits
    expires = max(kit_expiries(old.server.parent).values())
    empty = tmp_path / "no-shards-here"
    empty.mkdir()
    args = ["train", "--federation", str(federation), "--shards", str(empty), "--algorithm", "codasca", "-p", "T0=4",
            "--network", "small_resnet_gn", "--rounds", "2", "--local-steps", "2", "--batch-size", "16",
            "--eval-every", "0", "--backend", "flare", "--flare-env", "prod", "--flare-workspace", str(tmp_path / "flare")]
    try:
        consortium.start()
        warned = _warnings(old.admin)
        assert len(warned) == 6 and any(line.startswith("warning: the root CA expires on ") for line in warned), warned
        thread, before = trainings([*args, "--kit", str(old.admin), "--run-name", "before-renewal"])
        thread.join(300)
        assert before["exit_code"] == 0, before["output"]

        new = renew(out)
        consortium.stop()  # each participant stops its fedauc, puts its new kit in place and starts again
        consortium.kits = new
        consortium.start()
        assert dt.datetime.now(dt.timezone.utc) < expires, "renewal came after the old certificates expired"
        time.sleep((expires - dt.datetime.now(dt.timezone.utc)).total_seconds() + 2)
        with pytest.raises(ConfigError, match=r"(certificate|root CA) expired"):
            check_certificate(read_kit(old.sites["vienna"]))

        assert _warnings(new.admin) == []
        thread, after = trainings([*args, "--kit", str(new.admin), "--run-name", "after-renewal"])
        thread.join(300)
        assert after["exit_code"] == 0, after["output"]
        # Every hospital reported the centre's fedauc with the job; a version the centre announces names them all.
        assert f"every hospital that reported runs the centre's fedauc {code_version()}" in _status(new.admin)
        behind = _status(new.admin, "--announce", "9.9.9")
        assert "hospitals behind the centre's fedauc 9.9.9: barcelona (" in behind and "vienna (" in behind, behind
    finally:
        consortium.stop()
