"""`fedauc consortium provision` / `start-site`: real NVFlare provisioning (root CA, signed kits), and every
check a hospital meets before its client starts, each with its own message."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import socket

import pytest
import yaml
from typer.testing import CliRunner

from common.errors import DataError
from federated.flare.site.start import check_certificate, read_kit
from federated.sites import check_site_reports, site_report
from pipelines.cli import app
from preprocessing.qc import build_report
from preprocessing.qc_counts import central_summary
from preprocessing.shard_format import shard_content_hash
from preprocessing.sites import SharingPolicy

runner = CliRunner()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def consortium(melanoma_shards, tmp_path_factory):
    root, federation = melanoma_shards
    out = tmp_path_factory.mktemp("kits")
    port = _free_port()  # nothing listens there
    result = runner.invoke(app, ["consortium", "provision", str(federation), "--out", str(out), "--port", str(port)])
    assert result.exit_code == 0, result.output
    return root, out / "tiny-melanoma" / "prod_00", port, result.output


def test_provision_writes_a_kit_per_participant_and_says_where_each_goes(consortium):
    _, prod, port, summary = consortium
    assert sorted(p.name for p in prod.iterdir()) == ["admin@fedauc.org", "barcelona", "localhost", "new-york", "vienna"]
    vienna = read_kit(prod / "vienna")
    assert (vienna.name, vienna.server_host, vienna.server_port) == ("vienna", "localhost", port)
    assert check_certificate(vienna) > dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=300)
    assert "hospital 'vienna'" in summary and f"dials out to localhost:{port}; nothing inbound" in summary
    admin = prod / "admin@fedauc.org"
    assert f"--backend flare --flare-env prod --kit {admin}" in summary and "ProdEnv" not in summary
    assert "**new**" not in summary and "Re-provisioned" not in summary  # the first time every kit is sent
    assert f"**Never send `{prod.parent / 'state'}` anywhere: it stays with the project admin.**" in summary


def test_re_provisioning_marks_the_one_kit_to_send(melanoma_shards, tmp_path):
    """A fourth hospital joins: provisioning the same folder again makes its kit (same root CA) and says to send
    only that one; the others keep theirs."""
    root, federation = melanoma_shards
    out = tmp_path / "kits"
    assert runner.invoke(app, ["consortium", "provision", str(federation), "--out", str(out)]).exit_code == 0
    (tmp_path / "graz.yaml").write_text((root / "vienna.yaml").read_text().replace("name: vienna", "name: graz")
                                        .replace("root: data/vienna", f"root: {root / 'data' / 'vienna'}"))
    four = tmp_path / "four.yaml"
    four.write_text(yaml.safe_dump({"name": "tiny-melanoma", "task": "melanoma", "sites": [
        *({"config": str(root / f"{name}.yaml")} for name in ("vienna", "barcelona", "new-york")), {"config": "graz.yaml"}]}))
    again = runner.invoke(app, ["consortium", "provision", str(four), "--out", str(out)])
    assert again.exit_code == 0, again.output
    rows = {line.split("`")[1].rsplit("/", 1)[1]: line for line in again.output.splitlines() if line.startswith("| `")}
    assert sorted(rows) == ["admin@fedauc.org", "barcelona", "graz", "localhost", "new-york", "vienna"]
    assert "**new**: hospital 'graz'" in rows["graz"] and "send only the new kit(s) (graz)" in again.output
    for name in ("vienna", "barcelona", "new-york", "localhost", "admin@fedauc.org"):
        assert "keeps the kit it has" in rows[name] and "**new**" not in rows[name], name


def _start(kit, site_yaml, shards):
    return runner.invoke(app, ["consortium", "start-site", str(kit), "--site-yaml", str(site_yaml), "--shards", str(shards)])


def test_start_site_refuses_what_would_not_work(consortium, tmp_path):
    root, prod, port, _ = consortium
    result = _start(prod / "vienna", root / "barcelona.yaml", root / "shards")
    assert result.exit_code == 1 and "is site 'barcelona', the kit" in result.output and "issued to 'vienna'" in result.output

    result = _start(prod / "vienna", root / "vienna.yaml", tmp_path / "no-shards")
    assert result.exit_code == 1 and "site 'vienna': no shards at" in result.output

    result = _start(prod / "vienna", root / "vienna.yaml", root / "shards")
    assert result.exit_code == 1 and f"the consortium's server localhost:{port} cannot be reached" in result.output

    # A certificate from another consortium's CA in vienna's kit.
    other = tmp_path / "other"
    assert runner.invoke(app, ["consortium", "provision", str(root / "melanoma.yaml"), "--out", str(other)]).exit_code == 0
    forged = tmp_path / "forged"
    shutil.copytree(prod / "vienna", forged)
    shutil.copy(other / "tiny-melanoma" / "prod_00" / "vienna" / "startup" / "client.crt", forged / "startup" / "client.crt")
    result = _start(forged, root / "vienna.yaml", root / "shards")
    assert result.exit_code == 1 and "not signed by the consortium's root CA" in result.output

    with pytest.raises(Exception, match="the site's certificate expired on"):
        check_certificate(read_kit(prod / "vienna"), now=dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=5000))


def test_site_reports_carry_counts_only_and_the_centre_names_a_site_that_does_not_fit(melanoma_shards):
    """What a FLARE site returns about its data (federated.sites.site_report) and the centre's check of it."""
    root, _ = melanoma_shards
    names = ["vienna", "barcelona", "new-york"]
    reports = [site_report(name, root / "shards" / name, SharingPolicy(), (3, 32, 32), 1) for name in names]
    check_site_reports(reports, names, "melanoma", ("Melanoma",))
    vienna = reports[0]
    assert vienna["shard_hash"] == shard_content_hash(root / "shards" / "vienna") and vienna["qc_grid"] is None
    assert vienna["qc"] == central_summary(build_report(root / "shards" / "vienna"), 10, False)
    assert str(root) not in json.dumps(vienna)  # no path leaves the site
    strict = site_report("vienna", root / "shards" / "vienna", SharingPolicy(min_count=10_000), (3, 32, 32), 1)
    assert set(strict["qc"]["kept_per_split"].values()) == {"<10000"}  # the site's own policy suppresses

    with pytest.raises(DataError, match=r"site 'new-york': its model input shape is \[3, 64, 64\], "
                                        r"site 'vienna''s is \[3, 32, 32\]"):
        check_site_reports([*reports[:2], {**reports[2], "input_shape": [3, 64, 64]}], names, "melanoma",
                           ("Melanoma",))
    with pytest.raises(DataError, match=r"site 'barcelona': its shards are a 'chest-xray' task"):
        check_site_reports([reports[0], {**reports[1], "task": "chest-xray"}, reports[2]], names, "melanoma",
                           ("Melanoma",))
    with pytest.raises(DataError, match=r"the sites reported as \['vienna', 'barcelona'\]"):
        check_site_reports(reports[:2], names, "melanoma", ("Melanoma",))
