"""The CE baselines' update rules (docs/algorithms.md section 4), each checked against the equations
computed by hand in numpy on a logistic-regression model with full-batch steps."""

from __future__ import annotations

import numpy as np
import torch

import federated
from federated import TensorSite, TrainConfig
from federated.engine import Engine

N, D, LR = 30, 4, 0.3



def _data(K):
    rng = np.random.default_rng(7)
    out = []
    for k in range(K):
        x = (rng.standard_normal((N, D)) + k).astype(np.float32)
        y = (rng.random((N, 1)) < 0.3 + 0.2 * k).astype(np.float32)
        out.append((x, y))
    return out


def _cfg(algorithm, data, I, rounds=1, params=None):
    return TrainConfig(algorithm=algorithm, params=params or {}, network="linear", rounds=rounds, local_steps=I,
                       batch_size=N, lr=LR, progress=False, loader_workers=0,
                       sites=[TensorSite(train=(torch.from_numpy(x), y)) for x, y in data])


def _initial(cfg):
    model = Engine(cfg).sites[0].model[1]
    return np.concatenate([model.weight.detach().numpy().ravel(), model.bias.detach().numpy()]).astype(np.float64)


def _grad(theta, x, y):
    """Gradient of the mean BCE of a logistic model, (weights, bias)."""
    p = 1 / (1 + np.exp(-(x @ theta[:D] + theta[D])))
    r = p - y[:, 0]
    return np.concatenate([x.T @ r / len(r), [r.mean()]])


def _final(result):
    s = result.global_state
    return np.concatenate([s["1.weight"].numpy().ravel(), s["1.bias"].numpy()])


def test_fedavg_is_local_gradient_steps_then_the_mean():
    data = _data(2)
    cfg = _cfg("fedavg", data, I=3)
    theta0 = _initial(cfg)
    sites = []
    for x, y in data:
        t = theta0.copy()
        for _ in range(3):
            t = t - LR * _grad(t, x, y)
        sites.append(t)
    np.testing.assert_allclose(_final(federated.train(cfg)), np.mean(sites, 0), atol=1e-5)


def test_localsgdm_heavy_ball_and_fedprox_proximal_pull():
    data = _data(1)
    x, y = data[0]
    cfg = _cfg("localsgdm", data, I=3, params={"momentum": 0.9})
    t, m = _initial(cfg), 0.0
    for _ in range(3):
        m = 0.9 * m + _grad(t, x, y)
        t = t - LR * m
    np.testing.assert_allclose(_final(federated.train(cfg)), t, atol=1e-5)

    cfg = _cfg("fedprox", data, I=3, params={"mu": 2.0})
    t0 = _initial(cfg)
    t = t0.copy()
    for _ in range(3):
        t = t - LR * (_grad(t, x, y) + 2.0 * (t - t0))
    np.testing.assert_allclose(_final(federated.train(cfg)), t, atol=1e-5)


def test_scaffold_control_variates_are_the_mean_round_gradients():
    data = _data(3)
    I = 2
    cfg = _cfg("scaffold", data, I=I, rounds=2)
    theta0 = _initial(cfg)
    # Round 1: c = c_k = 0, plain local steps; c_k = mean of the round's gradients; c = mean_k c_k.
    ends, c_sites = [], []
    for x, y in data:
        t, grads = theta0.copy(), []
        for _ in range(I):
            grads.append(_grad(t, x, y))
            t = t - LR * grads[-1]
        ends.append(t)
        c_sites.append(np.mean(grads, 0))
    theta1, c = np.mean(ends, 0), np.mean(c_sites, 0)
    # Round 2: corrected steps w <- w - lr (g - c_k + c).
    ends, c_new = [], []
    for (x, y), ck in zip(data, c_sites):
        t, grads = theta1.copy(), []
        for _ in range(I):
            grads.append(_grad(t, x, y))
            t = t - LR * (grads[-1] - ck + c)
        ends.append(t)
        c_new.append(np.mean(grads, 0))
    result = federated.train(cfg)
    np.testing.assert_allclose(_final(result), np.mean(ends, 0), atol=1e-5)
    for k in range(3):
        st = result.site_states[k]
        got_c = np.concatenate([st["c.1.weight"].numpy().ravel(), st["c.1.bias"].numpy()])
        got_ck = np.concatenate([st["c_site.1.weight"].numpy().ravel(), st["c_site.1.bias"].numpy()])
        np.testing.assert_allclose(got_c, np.mean(c_new, 0), atol=1e-5)
        np.testing.assert_allclose(got_ck, c_new[k], atol=1e-5)
