"""Certificates that do not stop the consortium (federated/flare/centre/certificates.py, provision.renew): a consortium
provisioned with a root valid for minutes warns of every kit, `fedauc consortium renew` re-issues every kit
with the same names from the same root key (old and new kits trust each other both ways) and says what to
send to whom. The consortium training across a renewal is tests/test_consortium_renewal_poc.py."""

from __future__ import annotations

import datetime as dt

import pytest
from cryptography import x509
from typer.testing import CliRunner

from federated.flare.centre.certificates import STATE_FILE, expiry_warnings, kit_expiries
from federated.flare.centre.provision import project, provision
from pipelines.cli import app
from preprocessing.federation import load_federation

runner = CliRunner()
SITES = ["barcelona", "new-york", "vienna"]


def _cert(kit):
    startup = kit / "startup"
    return x509.load_pem_x509_certificate(((startup / "server.crt") if (startup / "server.crt").is_file()
                                           else (startup / "client.crt")).read_bytes())


def _root(kit):
    return x509.load_pem_x509_certificate((kit / "startup" / "rootCA.pem").read_bytes())


@pytest.fixture(scope="module")
def minutes(melanoma_shards, tmp_path_factory):
    _, federation = melanoma_shards
    out = tmp_path_factory.mktemp("kits")
    kits = provision(project(load_federation(federation), "localhost", 8002), out, root_valid_for=dt.timedelta(minutes=10))
    return out, kits


def test_a_root_valid_for_minutes_bounds_every_kit_and_each_is_warned_of(minutes):
    _, kits = minutes
    now = dt.datetime.now(dt.timezone.utc)
    expiries = kit_expiries(kits.server.parent)
    assert sorted(expiries) == ["admin@fedauc.org", "barcelona", "localhost", "new-york", "root CA", "vienna"]
    assert all(now < when <= now + dt.timedelta(minutes=10) for when in expiries.values()), expiries
    warnings = expiry_warnings(expiries)
    assert len(warnings) == 6 and warnings[0].startswith("warning: ") and "`fedauc consortium renew --out " in warnings[0]
    assert any(line.startswith("warning: the root CA expires on ") for line in warnings)
    # Nothing within 30 days: no warning; one day too late: every one.
    assert expiry_warnings(expiries, now=now - dt.timedelta(days=31)) == []
    assert all(" expired on " in line for line in expiry_warnings(expiries, now=now + dt.timedelta(days=1)))


def test_renew_reissues_every_kit_with_the_same_names_and_root_key(minutes):
    out, old = minutes
    renewed = runner.invoke(app, ["consortium", "renew", "--out", str(out)])
    assert renewed.exit_code == 0, renewed.output
    new_prod = out / "tiny-melanoma" / "prod_01"
    rows = {line.split("`")[1].rsplit("/", 1)[1]: line for line in renewed.output.splitlines() if line.startswith("| `")}
    assert sorted(rows) == sorted(["admin@fedauc.org", "localhost", *SITES])
    assert all(str(new_prod) in row and "keeps the kit" not in row for row in rows.values()), rows
    assert any(line.startswith("Renewed every kit with the same names") for line in renewed.output.splitlines())

    now = dt.datetime.now(dt.timezone.utc)
    old_root, new_root = _root(old.server), _root(new_prod / "localhost")
    assert new_root.public_key() == old_root.public_key() and new_root.subject == old_root.subject
    assert new_root.not_valid_after_utc > now + dt.timedelta(days=359)
    for name in ("localhost", "admin@fedauc.org", *SITES):
        before, after = _cert(old.server.parent / name), _cert(new_prod / name)
        assert after.subject == before.subject and after.serial_number != before.serial_number, name
        assert after.not_valid_after_utc > now + dt.timedelta(days=359), name
        # Both ways: a hospital on its new kit meets a server still on its old one, and the reverse.
        after.verify_directly_issued_by(old_root)
        before.verify_directly_issued_by(new_root)
    assert expiry_warnings(kit_expiries(new_prod)) == []
    assert (out / "tiny-melanoma" / "state" / STATE_FILE).stat().st_mode & 0o077 == 0

    # A second renewal well before the root expires keeps the root certificate itself.
    assert runner.invoke(app, ["consortium", "renew", "--out", str(out)]).exit_code == 0
    assert _root(out / "tiny-melanoma" / "prod_02" / "vienna") == new_root


def test_renew_without_the_provisioning_state_is_refused_in_one_line(minutes, tmp_path):
    out, _ = minutes
    (tmp_path / "project.yml").write_text((out / "project.yml").read_text())
    refused = runner.invoke(app, ["consortium", "renew", "--out", str(tmp_path)])
    assert refused.exit_code != 0 and "Traceback" not in refused.output
    assert f"{tmp_path / 'tiny-melanoma' / 'state' / STATE_FILE}: missing; the root CA's key is needed" in refused.output
    assert not (tmp_path / "tiny-melanoma").exists()
