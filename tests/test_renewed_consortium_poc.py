"""The consortium that tests/test_consortium_renewal_poc.py trained, renewed and started again from its new kits,
once its old kits have expired: a hospital on its old kit is refused by `start-site`, every participant starts
from its new kit, a training runs, status warns of nothing and names the hospitals behind a fedauc version the
centre announces. The consortium unit's last module: the other consortium modules run while the old kits
expire (run alone, it renews a consortium itself and waits for them)."""

from __future__ import annotations

import datetime as dt
import time

import pytest
from test_consortium_renewal_poc import renewed, status, training_args, warnings

from common.errors import ConfigError
from federated.flare.site.start import check_certificate, read_kit
from federated.version import code_version

pytestmark = pytest.mark.slow


def test_the_renewed_consortium_trains_once_its_old_kits_have_expired(poc_slot, melanoma_shards, tmp_path,
                                                                       monkeypatch, trainings, renewal, shared_prefect):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    if not renewal:
        renewal.update(renewed(melanoma_shards, tmp_path, trainings))
    consortium, old, expires = renewal["consortium"], renewal["old"], renewal["expires"]
    time.sleep(max(0.0, (expires - dt.datetime.now(dt.timezone.utc)).total_seconds() + 2))
    with pytest.raises(ConfigError, match=r"(certificate|root CA) expired"):
        check_certificate(read_kit(old.sites["vienna"]))

    monkeypatch.setenv("MLFLOW_TRACKING_URI", renewal["store"])
    new = consortium.kits
    try:
        consortium.start()
        assert warnings(new.admin) == []
        _, federation = melanoma_shards
        thread, after = trainings([*training_args(federation, renewal["folder"]), "--kit", str(new.admin),
                                   "--run-name", "after-renewal"])
        thread.join(300)
        assert after["exit_code"] == 0, after["output"]
        # Every hospital reported the centre's fedauc with the job; a version the centre announces names them all.
        assert f"every hospital that reported runs the centre's fedauc {code_version()}" in status(new.admin)
        behind = status(new.admin, "--announce", "9.9.9")
        assert "hospitals behind the centre's fedauc 9.9.9: barcelona (" in behind and "vienna (" in behind, behind
    finally:
        consortium.stop()
