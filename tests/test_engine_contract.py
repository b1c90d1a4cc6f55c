"""The engine's contract with the algorithms, and bugs of the first engine, each pinned by a test that
failed before its fix: stage statistics combined as the algorithm declares (CoDA's pooled class means
under weighted aggregation), the global model's BatchNorm statistics with ``bn_stats="local"``, a
distributed process group closed by ``train()``, algorithms reading parameters through the site caches,
every hook under the site's RNG."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import torch

import federated
from federated import Comm, SyntheticSite, TrainConfig
from federated.algorithms.coda import CoDA
from federated.algorithms.fedavg import FedAvg, FedAvgParams
from federated.engine import Engine
from federated.registry import register


def _cfg(**kw) -> TrainConfig:
    sites = [SyntheticSite(n_train=n, shape=(6,), num_classes=2, pos_rate=0.3, shift=0.8 * k, task_seed=3)
             for k, n in enumerate((24, 96, 48))]
    base = dict(algorithm="fedavg", sites=sites, network="linear", rounds=2, local_steps=2, batch_size=8, lr=0.1,
                progress=False, loader_workers=0)
    base.update(kw)
    return TrainConfig(**base)


@register
class _RecordingCoDA(CoDA):
    """CoDA that keeps each site's own stage statistics and what the engine handed back."""

    name = "test_recording_coda"
    own: dict[int, dict[str, torch.Tensor]] = {}
    combined: dict[int, dict[str, torch.Tensor]] = {}

    def stage_statistics(self, site):
        stats = super().stage_statistics(site)
        self.own[site.index] = {k: v.clone() for k, v in stats.items()}
        return stats

    def stage_start(self, site, stats):
        self.combined[site.index] = {k: v.clone() for k, v in stats.items()}
        super().stage_start(site, stats)


def test_coda_class_means_are_pooled_means_under_weighted_aggregation():
    """sum_k pos_sum_k / sum_k pos_count_k, not the ratio of weighted means (the sites differ in size)."""
    engine = Engine(_cfg(algorithm="test_recording_coda", params={"T0": 2}, aggregation="weighted", rounds=1))
    assert len(set(engine.weights)) == 3
    engine.run()
    own, combined = _RecordingCoDA.own, _RecordingCoDA.combined[1]
    for kind in ("pos", "neg"):
        pooled = (sum(own[k][f"{kind}_sum"] for k in own) / sum(own[k][f"{kind}_count"] for k in own))
        torch.testing.assert_close(combined[f"{kind}_sum"] / combined[f"{kind}_count"], pooled)
    # v_ref (and the restart point) is the mean of the iterates with the model's aggregation weights
    name = next(n for n in combined if n.startswith("mean.w."))
    torch.testing.assert_close(combined[name], sum(w * own[k][name] for k, w in enumerate(engine.weights)))


def test_global_model_with_local_bn_statistics_carries_the_pooled_statistics():
    engine = Engine(_cfg(network="mlp", network_kwargs={"hidden": 8}, bn_stats="local", rounds=1))
    engine.run()
    site_bn = [s.model[2] for s in engine.sites]  # the first BatchNorm1d
    means = torch.stack([bn.running_mean for bn in site_bn])
    variances = torch.stack([bn.running_var for bn in site_bn])
    w = torch.tensor(engine.weights)[:, None]
    pooled_mean = (w * means).sum(0)
    pooled_var = (w * (variances + means**2)).sum(0) - pooled_mean**2  # law of total variance
    assert not torch.allclose(pooled_var, (w * variances).sum(0), atol=1e-3)  # the sites differ
    bn = engine.global_model()[2]
    torch.testing.assert_close(bn.running_mean, pooled_mean)
    torch.testing.assert_close(bn.running_var, pooled_var)
    assert torch.equal(engine.sites[0].model[2].running_var, variances[0])  # the sites keep their own


def test_train_closes_the_process_group_it_opened(monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "1",
                       "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(key, value)
    from federated.backends import DistributedTransport

    cfg = _cfg(sites=_cfg().sites[:1], rounds=1, device="cpu")
    engine = Engine(cfg, DistributedTransport(cfg.timeout_s, torch.device("cpu")))
    assert torch.distributed.is_initialized()
    engine.run()
    engine.transport.close()
    assert not torch.distributed.is_initialized()


def test_algorithms_read_parameters_through_the_site_caches():
    """Walking the module tree every step costs more than a small model's update (federated/algorithms/base.py);
    only base.py's caches may do it."""
    root = Path(federated.__file__).parent / "algorithms"
    offenders = [f"{path.name}:{i}" for path in sorted(root.glob("*.py")) if path.name != "base.py"
                 for i, line in enumerate(path.read_text().splitlines(), 1)
                 if re.search(r"\.(named_)?parameters\(\)", line)]
    assert offenders == []


class _DrawParams(FedAvgParams):
    extra_draws_at_site0: int = 0


@register
class _DrawingHooks(FedAvg):
    """FedAvg whose hooks draw from the global torch RNG, site 0 more often than the others."""

    name = "test_drawing_hooks"
    Params = _DrawParams

    def state_spec(self, site):
        return {"draws": Comm.LOCAL}

    def init_site_state(self, site):
        return {"draws": torch.rand(1)}

    def _draw(self, site):
        if site.index == 0:
            torch.rand(self.p.extra_draws_at_site0)
        site.state["draws"] = torch.cat([site.state["draws"], torch.rand(1)])

    before_communication = round_end = _draw


def test_every_hook_runs_under_the_site_rng():
    """Site 1's draws in init_site_state, before_communication and round_end come from its own stream: the
    same whatever site 0 draws (and so the same as in its own process)."""
    runs = [federated.train(_cfg(algorithm="test_drawing_hooks", params={"extra_draws_at_site0": n}))
            for n in (0, 5)]
    assert runs[0].site_states[1]["draws"].shape == (5,)
    torch.testing.assert_close(runs[0].site_states[1]["draws"], runs[1].site_states[1]["draws"], rtol=0, atol=0)
    assert not torch.equal(runs[0].site_states[0]["draws"], runs[1].site_states[0]["draws"])
