"""Secure aggregation over NVIDIA FLARE: the simulator trains the in-process model bit for bit with it, the
server's ring sum is the in-process one, and the signed key exchange (federated/flare/site/keys.py, real
consortium kits from ``nvflare provision``) refuses a public key that was altered, swapped, signed by
another consortium or unsigned."""

from __future__ import annotations

import datetime as dt

import pytest
import torch

import federated
from common.errors import ConfigError
from federated.backends import ring_sum
from federated.flare.centre.job import train_flare
from federated.flare.centre.provision import project, provision
from federated.flare.server.rendezvous import COMBINE
from federated.flare.site.keys import SiteKeys, load_identity
from federated.secure_aggregation import SecureAggregationError, new_key
from federated.sites import federation_config
from preprocessing.federation import load_federation


@pytest.fixture(scope="module")
def kits(melanoma_shards, tmp_path_factory):
    """Two real consortia of the same three hospitals: ours, and another one with its own root CA."""
    federation = load_federation(melanoma_shards[1])
    ours = provision(project(federation, "localhost"), tmp_path_factory.mktemp("ours"))
    theirs = provision(project(federation, "localhost"), tmp_path_factory.mktemp("theirs"))
    return [s.name for s in federation.sites], ours, theirs


def _exchange(names, kits_by_site, job="job-1"):
    """Every site's signed entry, as the server would hand them back, and each site's SiteKeys."""
    sides = [SiteKeys(load_identity(kits_by_site[n] / "startup"), job, names) for n in names]
    publics = [new_key()[1] for _ in names]
    return sides, [side.signed(k, pub) for k, (side, pub) in enumerate(zip(sides, publics))], publics


def test_signed_keys_pass_and_every_tampering_is_refused(kits):
    names, ours, theirs = kits
    sides, entries, publics = _exchange(names, ours.sites)
    for side in sides:
        assert side.verified(entries) == publics
    tampered = [dict(e) for e in entries]
    tampered[1]["public_key"] = bytes([entries[1]["public_key"][0] ^ 1]) + entries[1]["public_key"][1:]
    with pytest.raises(SecureAggregationError, match=rf"site {names[1]!r} \(index 1\) is refused: its signature does not verify"):
        sides[0].verified(tampered)
    # The server substitutes a key it holds the private half of, signed by another consortium's kit.
    _, foreign, _ = _exchange(names, theirs.sites)
    with pytest.raises(SecureAggregationError, match="not issued by this consortium's root CA"):
        sides[0].verified([entries[0], foreign[1], entries[2]])
    # Site 2's genuine entry presented as site 1's (the index and the name are signed).
    swapped = [entries[0], {**entries[2], "site": names[1]}, entries[2]]
    with pytest.raises(SecureAggregationError, match=rf"its certificate belongs to {names[2]}"):
        sides[0].verified(swapped)
    # A key from another job, and an unsigned key (what a simulator site sends), are refused by a kit's site.
    _, other_job, _ = _exchange(names, ours.sites, job="job-2")
    with pytest.raises(SecureAggregationError, match="its signature does not verify"):
        sides[0].verified([entries[0], other_job[1], entries[2]])
    unsigned = {**entries[1], "certificate": None, "signature": None}
    with pytest.raises(SecureAggregationError, match="it is not signed"):
        sides[0].verified([entries[0], unsigned, entries[2]])
    later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=5000)
    with pytest.raises(SecureAggregationError, match="its certificate is not valid now"):
        sides[0].verified(entries, now=later)


def test_a_kit_missing_its_key_is_a_clear_error_and_no_kit_means_per_run_keys(kits, tmp_path):
    names, ours, _ = kits
    startup = tmp_path / "startup"
    startup.mkdir()
    assert load_identity(startup) is None  # the simulator: nothing to sign with
    (startup / "client.crt").write_bytes((ours.sites[names[0]] / "startup" / "client.crt").read_bytes())
    with pytest.raises(ConfigError, match=r"lacks client\.key, rootCA\.pem"):
        load_identity(startup)
    sim = SiteKeys(None, "job", names)
    publics = [new_key()[1] for _ in names]
    assert sim.verified([sim.signed(k, p) for k, p in enumerate(publics)]) == publics


def test_the_servers_ring_sum_is_the_backends_and_wraps_modulo_2_64():
    top = torch.tensor([2**63 - 1, -(2**63), 5], dtype=torch.int64)
    payloads = [top, torch.tensor([1, -1, -7], dtype=torch.int64), torch.tensor([0, 0, 3], dtype=torch.int64)]
    assert torch.equal(COMBINE["ring_sum"](payloads), torch.tensor([-(2**63), 2**63 - 1, 1], dtype=torch.int64))
    assert torch.equal(COMBINE["ring_sum"](payloads), ring_sum(payloads))


@pytest.mark.slow
def test_the_simulator_with_secure_aggregation_trains_the_in_process_model_bit_for_bit(tmp_path, melanoma_shards,
                                                                                      monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the site processes compute like this one-thread process
    root, federation = melanoma_shards
    settings = dict(algorithm="coda", params={"T0": 8}, network="small_resnet", network_kwargs={"widths": [8, 16, 32]},
                    rounds=2, local_steps=4, batch_size=32, lr=1.0, guarantee_positives=True, eval_every=1,
                    progress=False, loader_workers=0, timeout_s=60, device="cpu", secure_aggregation=True)
    cfg = federation_config(load_federation(federation), root / "shards", settings)
    flare = train_flare(cfg, load_federation(federation), root / "shards", "sim", tmp_path / "sim", name="test-secure")
    local = federated.train(cfg)
    assert flare.global_state.keys() == local.global_state.keys()
    for key, value in local.global_state.items():
        assert torch.equal(flare.global_state[key], value), key
    for mine, theirs in zip(local.history, flare.history, strict=True):
        assert theirs["train_loss"] == mine["train_loss"]
        assert theirs["bytes_sent"] == mine["bytes_sent"] and theirs["bytes_received"] == mine["bytes_received"]
        assert theirs["metrics"] == pytest.approx(mine["metrics"], abs=0, nan_ok=True)
