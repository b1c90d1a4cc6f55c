"""The NVFlare training mode (federated/flare/) under NVFlare's simulator: the same model as in-process,
bit for bit, for algorithms that exercise MEAN (CODASCA), stage statistics (LocalSCGDAM's stages) and
GATHER with the initial gather (FeDXL2's score pools); and the server's rendezvous on its own."""

from __future__ import annotations

import threading
import time

import pytest
import torch

import federated
from common.errors import DataError
from federated.backends import SiteFailure
from federated.flare.centre.job import train_flare
from federated.flare.server.rendezvous import COMBINE, Rendezvous
from federated.sites import federation_config
from preprocessing.federation import load_federation

pytestmark = pytest.mark.slow


def _config(melanoma_shards, algorithm: str, params: dict, **extra):
    root, federation = melanoma_shards
    settings = dict(algorithm=algorithm, params=params, network="small_resnet", network_kwargs={"widths": [8, 16, 32]},
                    rounds=2, local_steps=8, batch_size=32, lr=1.0, guarantee_positives=True, eval_every=1,
                    progress=False, loader_workers=0, timeout_s=60, device="cpu", **extra)
    return federation_config(load_federation(federation), root / "shards", settings)


# localscgdam combines its MEAN tensors by the coordinate-wise median (federated/aggregation.py): at the
# FLARE server (rendezvous.COMBINE["robust_mean"]) as in-process.
@pytest.mark.parametrize(("algorithm", "params", "extra"), [("codasca", {"T0": 8}, {}),
                                                            ("localscgdam", {}, {"robust_aggregation": "median"}),
                                                            ("fedxl2", {}, {})])
def test_simulated_consortium_trains_the_in_process_model(tmp_path, melanoma_shards, monkeypatch, algorithm, params,
                                                          extra):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the site processes compute like this one-thread process
    root, federation = melanoma_shards
    cfg = _config(melanoma_shards, algorithm, params, **extra)
    flare = train_flare(cfg, load_federation(federation), root / "shards", "sim", tmp_path / "sim",
                        name=f"test-{algorithm}")
    local = federated.train(cfg)
    assert flare.global_state.keys() == local.global_state.keys()
    # The summed valid histograms come back too: the registered model's operating points are read from them.
    assert local.valid_histograms is not None and flare.valid_histograms is not None
    assert abs(flare.valid_histograms - local.valid_histograms).sum() <= 2  # a score at a bin edge may move
    # The out-of-distribution refusal's model comes back too, from the same sums (federated/ood.py).
    assert local.ood is not None and flare.ood is not None
    assert flare.ood.reference.threshold == pytest.approx(local.ood.reference.threshold, rel=0.05)
    assert flare.ood.reference.train_images == local.ood.reference.train_images
    assert abs(flare.ood.valid_histogram - local.ood.valid_histogram).sum() <= 2
    worst = max((flare.global_state[k].float() - v.float()).abs().max().item() for k, v in local.global_state.items())
    assert worst <= 1e-5
    for mine, theirs in zip(local.history, flare.history, strict=True):
        assert theirs["train_loss"] == pytest.approx(mine["train_loss"], abs=1e-6)
        assert theirs["bytes_sent"] == mine["bytes_sent"] and theirs["bytes_received"] == mine["bytes_received"]
        for group, norms in mine["update_norm"].items():  # federated/health.py: every site's, at every site
            assert theirs["update_norm"][group] == pytest.approx(norms, rel=1e-5)
        assert theirs["metrics"].keys() == mine["metrics"].keys()
        assert theirs["metrics"]["valid/pooled/auc_macro"] == pytest.approx(mine["metrics"]["valid/pooled/auc_macro"],
                                                                           abs=1e-6, nan_ok=True)


def _contribute_all(rendezvous: Rendezvous, what: str, payloads: list, order: list[int]) -> list:
    results = [None] * len(payloads)

    def site(k):
        try:
            results[k] = rendezvous.contribute(1, what, k, payloads[k], COMBINE[what])
        except SiteFailure as err:
            results[k] = err

    threads = [threading.Thread(target=site, args=(k,)) for k in order]
    for t in threads:
        t.start()
        time.sleep(0.01)  # arrival order as given
    for t in threads:
        t.join(10)
    return results


def test_rendezvous_combines_in_site_order_whatever_the_arrival_order():
    flats = [torch.tensor([1e8, 1.0, -1e8]), torch.tensor([1.0, 3.0, 1e8]), torch.tensor([-1e8, 5.0, 1.0])]
    weights = [0.2, 0.3, 0.5]
    payloads = [{"weight": w, "flats": [f]} for w, f in zip(weights, flats)]
    want = flats[0] * weights[0]
    for w, f in zip(weights[1:], flats[1:]):
        want.add_(f, alpha=w)
    for order in ([0, 1, 2], [2, 0, 1], [1, 2, 0]):
        results = _contribute_all(Rendezvous(["a", "b", "c"], 5), "mean", payloads, order)
        assert all(torch.equal(r[0], want) for r in results)
    rows = [torch.full((n, 2), float(k)) for k, n in enumerate((2, 0, 3))]
    results = _contribute_all(Rendezvous(["a", "b", "c"], 5), "gather", rows, [2, 1, 0])
    assert all(torch.equal(r, torch.cat(rows)) for r in results)


def test_rendezvous_names_the_site_that_never_came():
    rendezvous = Rendezvous(["vienna", "barcelona", "new-york"], 0.5)
    started = time.monotonic()
    results = _contribute_all(rendezvous, "barrier", [None, None], [0, 1])
    assert time.monotonic() - started < 3
    assert all(isinstance(r, SiteFailure) for r in results)
    assert "site(s) new-york did not reach barrier (collective #1) within 0.5 s" in str(results[0])
    with pytest.raises(SiteFailure, match="new-york"):  # later collectives fail at once
        rendezvous.contribute(2, "barrier", 0, None, COMBINE["barrier"])


def test_a_site_whose_images_give_another_model_input_stops_the_job_before_training(tmp_path, melanoma_shards):
    """new-york preprocessed at 40 px beside 32 px sites: small_resnet would train on it (adaptive pooling),
    but the sites compare their model inputs first and the job fails naming it, before any round."""
    import shutil

    import yaml

    from federated.checkpoint import latest_round_dir
    from federated.flare.centre.job import FlareJobFailed
    from preprocessing.scan import scan_site
    from preprocessing.shards import shard_site
    from preprocessing.sites import load_site

    root, federation = melanoma_shards
    for name in ("vienna", "barcelona"):
        shutil.copytree(root / "shards" / name, tmp_path / "shards" / name)
    site = yaml.safe_load((root / "new-york.yaml").read_text())
    (tmp_path / "new-york.yaml").write_text(yaml.safe_dump({**site, "root": str(root / site["root"]), "image_size": 40}))
    config = load_site(tmp_path / "new-york.yaml")
    shard_site(config, scan_site(config), tmp_path / "shards", workers=0, progress=False)
    settings = dict(algorithm="fedavg", network="small_resnet", network_kwargs={"widths": [8, 16, 32]}, rounds=2,
                    local_steps=2, batch_size=16, progress=False, loader_workers=0, timeout_s=60, device="cpu",
                    checkpoint_dir=str(tmp_path / "checkpoints"))
    # Where the centre reads the shards (here, the simulator's), it refuses before any job (federated/sites.py
    # check_shards_fit); a running consortium's centre reads none, and the sites' own check stops the job.
    with pytest.raises(DataError, match=r"the sites' shards do not fit together: vienna 32 px x 3 channel\(s\), "
                                        r"barcelona 32 px x 3 channel\(s\), new-york 40 px x 3 channel\(s\)"):
        federation_config(load_federation(federation), tmp_path / "shards", settings)
    cfg = federation_config(load_federation(federation), tmp_path / "shards", settings, read_shards=False)
    with pytest.raises(FlareJobFailed, match=r"site 'new-york': its model input shape is \[3, 40, 40\], "
                                             r"site 'vienna''s is \[3, 32, 32\]"):
        train_flare(cfg, load_federation(federation), tmp_path / "shards", "sim", tmp_path / "sim", name="test-inputs")
    assert latest_round_dir(tmp_path / "checkpoints") is None


def test_only_a_lost_port_race_makes_the_simulator_run_again(tmp_path):
    from federated.flare.centre.job import _lost_port_race

    log = tmp_path / "job" / "barcelona" / "log.txt"
    log.parent.mkdir(parents=True)
    log.write_text("ERROR - Execute exception: OSError: [Errno 98] Address already in use\n")
    assert _lost_port_race(tmp_path / "job")
    log.write_text("ERROR - fedauc training failed: site 'barcelona': DataError: no shards\n")
    assert not _lost_port_race(tmp_path / "job")
