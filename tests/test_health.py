"""Training health (federated/health.py): a diverged or non-finite site stops the training at that round,
naming it, with the last good round's checkpoint kept for a resume at a lower learning rate; an outlying
site's update is named in a warning; every site's update norms reach the round's record."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch

import federated
from common.errors import ConfigError, FedaucError
from federated import TensorSite, TrainConfig
from federated.aggregation import Robust
from federated.checkpoint import latest_round_dir
from federated.health import (
    HealthMonitor,
    SiteUpdate,
    TrainingDiverged,
    as_diverged,
    relative_to_others,
    site_row,
    update_groups,
)
from federated.state import Comm


def _data(n, seed, scale=1.0, nan=False):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6)).astype(np.float32)
    y = (x[:, 0] + 0.5 * rng.normal(size=n) > 0.3).astype(np.float32)
    x *= scale
    if nan:
        x[::7, 2] = np.nan  # a broken export: some pixels NaN
    return x, y


def _sites(scale=(1.0, 1.0, 1.0), nan=(False, False, False)):
    return [TensorSite(name=name, train=_data(48, k, s, bad), test=_data(40, 10 + k))
            for k, (name, s, bad) in enumerate(zip(("a", "b", "c"), scale, nan))]


def _cfg(**kw):
    base = dict(algorithm="fedavg", sites=_sites(), network="linear", rounds=2, local_steps=3, batch_size=8,
                lr=0.1, progress=False, loader_workers=0)
    base.update(kw)
    return TrainConfig(**base)


def test_a_site_whose_data_gives_nan_is_named_at_its_round():
    with pytest.raises(TrainingDiverged) as err:
        federated.train(_cfg(sites=_sites(nan=(False, True, False))))
    message = str(err.value)
    assert message.startswith("site(s) 'b', round 0: the training loss is nan")
    assert "--lr, now 0.1" in message and "--resume --lr <lower>" in message and "check that site's data" in message


def test_an_exploding_loss_stops_at_its_round_and_a_resume_at_a_lower_lr_continues(tmp_path):
    ckpt = tmp_path / "ckpt"
    federated.train(_cfg(checkpoint_dir=ckpt))  # two good rounds at lr 0.1
    with pytest.raises(TrainingDiverged, match=r"'a', 'b', 'c', round 2: the training loss .* grew past 1000x") as err:
        federated.train(_cfg(checkpoint_dir=ckpt, resume=True, rounds=4, lr=1e9))
    assert "--lr, now 1e+09" in str(err.value)
    assert latest_round_dir(ckpt).name == "round_000001"  # the diverged round was never checkpointed
    resumed = federated.train(_cfg(checkpoint_dir=ckpt, resume=True, rounds=4, lr=0.05))
    assert [h["lr"] for h in resumed.history] == [0.1, 0.1, 0.05, 0.05]  # the change of rate is recorded
    assert all(math.isfinite(h["train_loss"]) for h in resumed.history)
    assert all(torch.isfinite(t).all() for t in resumed.global_state.values())


def test_update_norms_reach_the_record_and_an_outlying_site_is_named(caplog):
    # Site c's export is scaled 1000x (features, so its gradients): it trains, but its update dwarfs the others'.
    with caplog.at_level(logging.WARNING, logger="fedauc.health"):
        result = federated.train(_cfg(sites=_sites(scale=(1.0, 1.0, 1000.0)), rounds=1, algorithm="scaffold"))
    record = result.history[0]
    assert set(record["update_norm"]) == {"model", "c"}  # the model and SCAFFOLD's control variate
    rel = record["update_norm_rel"]["model"]
    assert rel[2] > 100 and rel[0] < 1 and rel[1] < 1
    assert any("round 0: site 'c' sent an update to the model" in m and "other sites' median" in m
               for m in record["outliers"])
    assert not any("site 'a'" in m or "site 'b'" in m for m in record["outliers"])
    assert record["outliers"][0] in caplog.text
    honest = federated.train(_cfg(rounds=1))
    assert honest.history[0]["outliers"] == []


def test_site_update_norms_per_group_and_nan():
    tensors = {"model.w": torch.ones(3), "model.b": torch.zeros(2), "v": torch.ones(4), "n": torch.ones(2)}
    spec = {"model.w": Comm.MEAN, "model.b": Comm.MEAN, "v": Comm.MEAN, "n": Comm.LOCAL}
    groups = update_groups(spec, tensors)
    assert groups == {"model": ["model.w", "model.b"], "v": ["v"]}
    update = SiteUpdate(tensors, groups)
    update.restart(tensors)
    sent = {**tensors, "model.w": torch.tensor([1.0, 4.0, 5.0]), "v": torch.full((4,), 2.0)}
    assert update.norms(sent).tolist() == pytest.approx([5.0, 2.0])
    update.restart(tensors)
    sent["v"] = torch.tensor([1.0, float("nan"), 1.0, 1.0])
    assert not torch.isfinite(update.norms(sent)[1])


def test_a_non_finite_update_names_its_site_and_tensor():
    monitor = HealthMonitor(["a", "b", "c"], ["model", "c_cv"], _cfg())
    with pytest.raises(TrainingDiverged, match=r"site\(s\) 'c', round 4: its update to the algorithm's state 'c_cv' "
                                               r"is not finite"):
        monitor.check(4, torch.cat([site_row(k, 8, 8, torch.tensor([0.5, 0.7]), torch.tensor([1.0, norm]))
                                    for k, norm in enumerate([1.0, 1.0, math.inf])]))
    assert relative_to_others([1.0, 2.0, 3.0, 100.0]) == pytest.approx([1 / 3, 2 / 3, 3 / 2, 100 / 2])
    assert math.isnan(relative_to_others([5.0])[0])


def test_median_aggregation_keeps_a_1000x_site_out_of_the_global_model():
    def weights(result):
        return torch.cat([v.flatten() for v in result.global_state.values()])

    scaled = _sites(scale=(1.0, 1.0, 1000.0))
    honest = weights(federated.train(_cfg(sites=scaled[:2], rounds=1)))  # the honest sites' mean, same streams
    mean = weights(federated.train(_cfg(sites=scaled, rounds=1)))
    median = weights(federated.train(_cfg(sites=scaled, rounds=1, robust_aggregation="median")))
    assert (mean - honest).norm() > 100 * (median - honest).norm()
    assert (median - honest).norm() < 0.2 * honest.norm()


def test_robust_rules_coordinate_wise():
    flats = [torch.tensor([1.0, 10.0]), torch.tensor([2.0, -5.0]), torch.tensor([1e6, 0.0]), torch.tensor([3.0, 1.0])]
    assert Robust("median")(flats, []).tolist() == [2.5, 0.5]  # even K: the mean of the middle two
    assert Robust("median")(flats[:3], []).tolist() == [2.0, 0.0]
    assert Robust("trimmed-mean", 0.25)(flats, []).tolist() == [2.5, 0.5]  # drops 1 at each end
    five = [*flats, torch.tensor([4.0, 2.0])]
    assert Robust("trimmed-mean", 0.2)(five, []).tolist() == [3.0, 1.0]  # mean of (2, 3, 4) and (0, 1, 2)
    with pytest.raises(ConfigError, match="trimmed-mean drops 1 site"):
        federated.train(_cfg(sites=_sites()[:2], robust_aggregation="trimmed-mean"))



def test_a_divergence_a_flare_site_reports_ends_the_same_at_the_centre():
    reason = ("the simulated NVFlare job failed: site 'b' failed: TrainingDiverged: site(s) 'b', round 3: the training "
              "loss is nan (the training diverged)")
    converted = as_diverged(FedaucError(reason, fix="the logs are under sim/"), 1e9)
    assert isinstance(converted, TrainingDiverged)
    assert str(converted).startswith("site(s) 'b', round 3: the training loss is nan (the training diverged)\n  fix: "
                                     "lower the learning rate (--lr, now 1e+09)")
    other = FedaucError("site 'b' failed: DataError: ...")
    assert as_diverged(other, 0.1) is other
