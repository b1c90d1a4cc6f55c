"""The federated engine: communication bytes from the state declaration, gather, checkpoint/resume,
shard loading, the per-site loader, the global prior, evaluation and config validation."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import roc_auc_score

import federated
from federated import Comm, SyntheticSite, TensorSite, TrainConfig
from federated.algorithms.fedavg import FedAvg
from federated.data import SiteLoader, load_shard
from federated.engine import Engine
from federated.registry import register
from preprocessing.shard_format import FORMAT_VERSION, SHARD_FILE


def _sites(K=3, **kw):
    base = dict(n_train=64, shape=(6,), num_classes=2, pos_rate=0.3, task_seed=3)
    base.update(kw)
    return [SyntheticSite(shift=0.4 * k, **base) for k in range(K)]


def _cfg(**kw):
    base = dict(algorithm="fedavg", sites=_sites(), network="linear", rounds=2, local_steps=3, batch_size=8,
                lr=0.1, progress=False, loader_workers=0)
    base.update(kw)
    return TrainConfig(**base)


# --- bytes: from the declaration ----------------------------------------------------------------

def test_bytes_per_round_follow_the_declaration():
    n_model = (6 * 2 + 2) * 4  # linear 6 -> 2, float32
    fedavg = federated.train(_cfg())
    assert [h["bytes_sent"] for h in fedavg.history] == [[n_model] * 3] * 2
    assert [h["bytes_received"] for h in fedavg.history] == [[n_model] * 3] * 2
    scaffold = federated.train(_cfg(algorithm="scaffold"))
    assert scaffold.history[0]["bytes_sent"] == [2 * n_model] * 3  # model and control variate
    # CODASCA: (w, a, b, alpha) and one control variate per tensor; a, b, alpha have C = 2 entries.
    # Stage boundary every 6 iterations = every 2nd round: the stage mean of v (the new v_ref) is averaged
    # in addition, and with the paper's restart that of alpha too (its restart point, docs/algorithms.md
    # section 5).
    codasca = federated.train(_cfg(algorithm="codasca", params={"T0": 6}))
    n_v = n_model + 2 * 2 * 4
    n_alpha = 2 * 4
    assert codasca.history[0]["bytes_sent"] == [2 * (n_v + n_alpha)] * 3
    assert codasca.history[1]["bytes_sent"] == [2 * (n_v + n_alpha) + n_v] * 3
    restart = federated.train(_cfg(algorithm="codasca", params={"T0": 6, "stage_restart": True}))
    assert restart.history[1]["bytes_sent"] == [2 * (n_v + n_alpha) + n_v + n_alpha] * 3


def test_bn_statistics_are_averaged_or_kept_local():
    mean = Engine(_cfg(network="mlp", rounds=1, bn_stats="mean"))
    local = Engine(_cfg(network="mlp", rounds=1, bn_stats="local"))
    mean.run()
    local.run()
    key = "2.running_mean"
    assert torch.equal(mean.sites[0].model.state_dict()[key], mean.sites[2].model.state_dict()[key])
    assert not torch.equal(local.sites[0].model.state_dict()[key], local.sites[2].model.state_dict()[key])
    bn_bytes = 2 * 2 * 64 * 4  # two BN layers x (running mean, running var) x 64 features
    assert mean.spec["model.2.running_mean"] is Comm.MEAN and local.spec["model.2.running_mean"] is Comm.LOCAL
    sent_mean = federated.train(_cfg(network="mlp", rounds=1, bn_stats="mean")).history[0]["bytes_sent"][0]
    sent_local = federated.train(_cfg(network="mlp", rounds=1, bn_stats="local")).history[0]["bytes_sent"][0]
    assert sent_mean - sent_local == bn_bytes


@register
class _ScorePool(FedAvg):
    """FedAvg that gathers each site's last batch scores: exercises the ``gather`` kind."""

    name = "test_score_pool"

    def state_spec(self, site):
        return {"scores": Comm.GATHER}

    def init_site_state(self, site):
        return {"scores": torch.zeros(0, self.fed.num_classes)}

    def local_step(self, site, batch):
        loss = super().local_step(site, batch)
        # Sites send different row counts: K + 1 rows at site K.
        site.state["scores"] = torch.full((site.index + 1, self.fed.num_classes), float(site.index))
        return loss


def test_gather_concatenates_sites_in_order_and_counts_bytes():
    result = federated.train(_cfg(algorithm="test_score_pool", rounds=1))
    pooled = result.site_states[0]["scores"]
    expected = torch.cat([torch.full((k + 1, 2), float(k)) for k in range(3)])
    assert all(torch.equal(result.site_states[k]["scores"], expected) for k in range(3))
    n_model = (6 * 2 + 2) * 4
    row = 2 * 4
    assert result.history[0]["bytes_sent"] == [n_model + (k + 1) * row for k in range(3)]
    assert result.history[0]["bytes_received"] == [n_model + (len(pooled) - k - 1) * row for k in range(3)]


# --- checkpoint / resume --------------------------------------------------------------------------

def test_resume_reaches_the_same_model_as_an_uninterrupted_run(tmp_path):
    common = dict(algorithm="codasca", params={"T0": 4, "eta_g": 1.5}, network="mlp", local_steps=2,
                  guarantee_positives=True, sites=_sites(pos_rate=0.1))
    full = federated.train(_cfg(rounds=6, **common))
    federated.train(_cfg(rounds=3, checkpoint_dir=tmp_path, **common))
    assert (tmp_path / "LATEST").read_text() == "round_000002"
    # Older rounds pruned; the one before the last stays, so that the sites of a consortium, each with its own
    # folder, can agree on the last round all of them completed (federated/flare/site/resume.py).
    assert sorted(p.name for p in tmp_path.glob("round_*")) == ["round_000001", "round_000002"]
    resumed = federated.train(_cfg(rounds=6, checkpoint_dir=tmp_path, resume=True, **common))
    for key, value in full.global_state.items():
        assert torch.equal(value, resumed.global_state[key]), key
    for name, value in full.site_states[1].items():
        assert torch.equal(value, resumed.site_states[1][name]), name
    assert [h["round"] for h in resumed.history] == list(range(6))
    assert [h["train_loss"] for h in resumed.history] == [h["train_loss"] for h in full.history]


# --- data -----------------------------------------------------------------------------------------

def _write_shard(root, site, labels, diseases=("Cardiomegaly", "Edema"), size=8, splits=("train",)):
    root.mkdir(parents=True)
    (root / SHARD_FILE).write_text(json.dumps({"format_version": FORMAT_VERSION, "site": site, "task": "chest-xray",
                                              "diseases": list(diseases)}))
    rng = np.random.default_rng(len(labels))
    for split in splits:
        (root / split).mkdir()
        np.save(root / split / "images.npy", rng.integers(0, 256, (len(labels), size, size), dtype=np.uint8))
        frame = pd.DataFrame({"record_id": [f"r{i}" for i in range(len(labels))]})
        for c, d in enumerate(diseases):
            frame[d] = np.asarray(labels, dtype=np.float32)[:, c]
        frame.to_parquet(root / split / "manifest.parquet")


def test_shard_loading_masks_missing_labels_and_normalizes_on_device(tmp_path):
    labels = [[1, np.nan], [0, 1], [np.nan, 0], [1, 1]]
    _write_shard(tmp_path / "a", "hosp-a", labels)
    data = load_shard(tmp_path / "a")
    assert data.name == "hosp-a" and data.diseases == ("Cardiomegaly", "Edema")
    assert isinstance(data.train.images, np.memmap)
    loader = SiteLoader(data.train, batch_size=4, seed=0, device=torch.device("cpu"), workers=1)
    (batch,) = list(loader.batches(1))
    assert batch.x.shape == (4, 1, 8, 8) and batch.x.dtype == torch.float32
    raw = np.asarray(data.train.images)[batch.index.numpy()]
    assert torch.allclose(batch.x[:, 0], torch.from_numpy(raw).float() / 255)
    want = np.asarray(labels, dtype=np.float32)[batch.index.numpy()]
    assert torch.equal(batch.mask, torch.from_numpy(~np.isnan(want)).float())
    assert torch.equal(batch.y, torch.from_numpy(np.nan_to_num(want)))


def test_shard_with_a_bad_label_names_file_row_and_column(tmp_path):
    _write_shard(tmp_path / "b", "hosp-b", [[1, 0], [0, -1.0]])
    with pytest.raises(ValueError, match=r"manifest.parquet: row 1, column 'Edema': label -1.0"):
        load_shard(tmp_path / "b")


def test_training_from_shards_with_the_global_prior(tmp_path):
    a = [[1, np.nan], [0, 0], [0, 1], [0, 0], [1, 0], [0, 0]]
    b = [[0, 1], [0, 0], [np.nan, 0], [0, 0]]
    _write_shard(tmp_path / "a", "a", a, splits=("train", "test"))
    _write_shard(tmp_path / "b", "b", b, splits=("train", "test"))
    cfg = TrainConfig(algorithm="codaplus", sites=[{"kind": "shard", "path": tmp_path / "a"},
                                                   {"kind": "shard", "path": tmp_path / "b"}],
                      network="small_resnet", rounds=1, local_steps=1, batch_size=4, progress=False,
                      augment_flip=True, augment_shift=1)
    engine = Engine(cfg)
    pooled = np.concatenate([np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32)])
    expected_prior = np.nanmean(pooled, axis=0)
    assert torch.allclose(engine.fed.prior.cpu(), torch.tensor(expected_prior), atol=1e-7)
    assert engine.fed.positives.tolist() == [2.0, 2.0] and engine.fed.negatives.tolist() == [7.0, 7.0]
    result = engine.run()
    # Pooled AUC ranks every site's test samples together; checked against scikit-learn.
    model = result.model().eval()
    scores, ys = [], []
    for site, lab in (("a", a), ("b", b)):
        imgs = np.load(tmp_path / site / "test" / "images.npy")
        with torch.no_grad():
            scores.append(torch.sigmoid(model(torch.from_numpy(imgs).float()[:, None] / 255)).numpy())
        ys.append(np.asarray(lab, dtype=np.float32))
    s, y = np.concatenate(scores), np.concatenate(ys)
    known = ~np.isnan(y[:, 0])
    metrics = result.history[-1]["metrics"]
    got, bound = metrics["test/pooled/auc/Cardiomegaly"], metrics["test/pooled/auc_bound/Cardiomegaly"]
    assert abs(got - roc_auc_score(y[known, 0], s[known, 0])) <= bound + 1e-12


def test_loader_covers_each_epoch_and_guarantees_positives():
    labels = np.zeros((50, 2), dtype=np.float32)
    labels[[3, 17], 0] = 1.0
    labels[:, 1] = np.nan  # a disease without positives at this site: nothing to guarantee
    split = federated.data.SplitData(torch.zeros(50, 2), labels)
    plain = SiteLoader(split, batch_size=10, seed=1, device=torch.device("cpu"), workers=0)
    assert sorted(np.concatenate([plain.next_indices() for _ in range(5)]).tolist()) == list(range(50))
    guaranteed = SiteLoader(split, batch_size=10, seed=1, device=torch.device("cpu"), guarantee_positives=True,
                            workers=2)
    for batch in guaranteed.batches(20):
        assert batch.y[:, 0].sum() >= 1
        assert torch.equal(batch.y[:, 0], torch.from_numpy(labels[batch.index.numpy(), 0]))


# --- validation -------------------------------------------------------------------------------

def test_config_errors_are_explicit():
    with pytest.raises(ValueError, match=r"unknown algorithm 'fedsgd'\n  fix: did you mean 'fedsgda_m'\? registered: .*codasca"):
        federated.train(_cfg(algorithm="fedsgd"))
    with pytest.raises(ValueError, match="eta_g"):
        federated.train(_cfg(algorithm="codasca", params={"eta_g": -1}))
    with pytest.raises(ValueError, match="must be a multiple of local_steps"):
        federated.train(_cfg(algorithm="codaplus", params={"T0": 5}))
    with pytest.raises(ValueError, match="resume=True needs checkpoint_dir"):
        _cfg(resume=True)
    with pytest.raises(ValueError, match="compile_mode='reduce-overhead' needs compile_network=True"):
        _cfg(compile_mode="reduce-overhead")


def test_device_augmentation_flips_and_shifts_within_bounds():
    torch.manual_seed(0)
    x = torch.arange(2 * 1 * 4 * 5, dtype=torch.float32).reshape(2, 1, 4, 5)
    flipped = federated.data.augment(x.repeat(50, 1, 1, 1), flip=True, max_shift=0)
    is_flip = torch.tensor([torch.equal(f, x[i % 2].flip(-1)) for i, f in enumerate(flipped)])
    is_same = torch.tensor([torch.equal(f, x[i % 2]) for i, f in enumerate(flipped)])
    assert bool((is_flip | is_same).all()) and 20 < int(is_flip.sum()) < 80
    shifted = federated.data.augment(x, flip=False, max_shift=1)
    padded = torch.nn.functional.pad(x, (1, 1, 1, 1), mode="replicate")
    for i in range(2):  # every output is one of the 9 crops of the replicate-padded image
        crops = [padded[i, :, dy:dy + 4, dx:dx + 5] for dy in range(3) for dx in range(3)]
        assert any(torch.equal(shifted[i], c) for c in crops)


def test_weighted_aggregation_and_site_local_prior():
    rng = np.random.default_rng(4)
    data = [(torch.randn(n, 6), torch.from_numpy((rng.random((n, 2)) < p).astype(np.float32)))
            for n, p in ((10, 0.3), (30, 0.6))]
    data[0][1][:2] = torch.tensor([[1.0, 1.0], [0.0, 0.0]])

    def final(sites, **kw):
        cfg = _cfg(sites=[TensorSite(train=d) for d in sites], rounds=1, local_steps=1, batch_size=64, **kw)
        return federated.train(cfg).global_state["1.weight"]

    alone = [final([d]) for d in data]  # one step from the same initial model at each site
    torch.testing.assert_close(final(data, aggregation="weighted"), 0.25 * alone[0] + 0.75 * alone[1])
    torch.testing.assert_close(final(data), 0.5 * alone[0] + 0.5 * alone[1])
    engine = Engine(_cfg(sites=[TensorSite(train=d) for d in data], prior="local"))
    for site, (_, y) in zip(engine.sites, data):
        torch.testing.assert_close(site.prior.cpu(), y.mean(0))


@register
class _ShapeShifter(FedAvg):
    """Breaks the contract on purpose: resizes a MEAN tensor after it was declared."""

    name = "test_shape_shifter"

    def state_spec(self, site):
        return {"v": Comm.MEAN}

    def init_site_state(self, site):
        return {"v": torch.zeros(3)}

    def before_communication(self, site):
        site.state["v"] = torch.zeros(4)


def test_a_mean_tensor_that_changes_shape_is_refused():
    with pytest.raises(RuntimeError, match=r"MEAN tensor 'v' is now \(4,\) torch.float32, declared \(\(3,\)"):
        federated.train(_cfg(algorithm="test_shape_shifter"))


def test_in_process_mean_writes_the_weighted_mean_into_every_layout():
    """The averaged buffer goes back in one multi-tensor copy: channels-last (as convolution weights are on
    a GPU), transposed and plain tensors of two dtypes each get their own weighted mean, in place."""
    from federated.backends import InProcessTransport

    torch.manual_seed(0)
    sites = [[torch.randn(4, 3, 2, 2).contiguous(memory_format=torch.channels_last), torch.randn(3, 5).t(),
              torch.randn(7), torch.randn(2, dtype=torch.float64)] for _ in range(3)]
    weights = [0.5, 0.3, 0.2]
    expected = [sum(w * site[i] for w, site in zip(weights, sites)) for i in range(4)]
    storages = [[t.data_ptr() for t in site] for site in sites]
    InProcessTransport(3).mean_(sites, weights)
    for site, pointers in zip(sites, storages):
        assert [t.data_ptr() for t in site] == pointers  # in place: optimizers and CUDA graphs hold these tensors
        assert site[0].is_contiguous(memory_format=torch.channels_last)
        for got, want in zip(site, expected):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_compile_network_trains_through_a_compiled_graph_and_keeps_the_state():
    """compile_network must compile (nn.Module.compile() silently ran eager under torch 2.13) and change
    nothing else: the same state_dict keys and, for this network, the same model as eager."""
    from torch._dynamo.utils import counters

    # A network without len(): an `or` on torch.compile's wrapper raised for it.
    # One residual stage: each stage's shapes are kernels of their own for g++ to compile on CPU (the default
    # three stages cost 10 CPU s more on a cold cache, which CI always has).
    config = {"algorithm": "codasca", "params": {}, "network": "small_resnet", "network_kwargs": {"widths": [4, 8]},
              "rounds": 1, "local_steps": 2, "sites": _sites(K=2, shape=(1, 8, 8))}
    eager = federated.train(_cfg(**config))
    torch._dynamo.reset()
    counters.clear()
    compiled = federated.train(_cfg(**config, compile_network=True))
    assert counters["stats"]["unique_graphs"] >= 1
    assert list(compiled.global_state) == list(eager.global_state)
    for name, value in eager.global_state.items():
        torch.testing.assert_close(compiled.global_state[name], value, rtol=1e-5, atol=1e-6)
