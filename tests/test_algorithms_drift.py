"""Client drift on convex problems with a known optimum (docs/algorithms.md sections 4 and 5).

Strongly heterogeneous sites (per-site shifted inputs and label rates), full-batch local steps so that
the fixed points are deterministic. FedAvg and CODA+ converge to a point whose distance from the
centralized optimum grows with the number of local steps I; SCAFFOLD and CODASCA, whose control
variates cancel the sites' gradient disagreement, converge to the optimum for every I. The optimum is
computed here from first principles (Newton's method / a linear solve), not with the engine.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import federated
from federated import TensorSite, TrainConfig
from models.objectives import auc_margin_loss

K, N, D = 4, 40, 3
WD = 0.05  # logistic regression: L2 weight making the optimum unique
WD_AUC = 0.2  # AUC-M: strong convexity in (w, a, b) large enough to converge in a few hundred steps



@pytest.fixture(scope="module")
def sites():
    rng = np.random.default_rng(0)
    w_true = rng.standard_normal(D)
    out = []
    for k in range(K):
        x = rng.standard_normal((N, D)) + rng.standard_normal(D) * 1.5
        logit = x @ w_true + (k - 1.5) * 1.5  # site-specific label rates
        y = (rng.random(N) < 1 / (1 + np.exp(-logit))).astype(np.float32)
        y[:2], y[2:4] = 1.0, 0.0  # both classes at every site
        out.append((torch.tensor(x, dtype=torch.float32), torch.tensor(y)[:, None]))
    return out


def _run(sites, algorithm, I, rounds, lr, params):
    cfg = TrainConfig(algorithm=algorithm, params=params, sites=[TensorSite(train=s) for s in sites],
                      network="linear", rounds=rounds, local_steps=I, batch_size=N, lr=lr,
                      progress=False, loader_workers=0)
    state = federated.train(cfg).global_state
    return torch.cat([state["1.weight"].flatten(), state["1.bias"].flatten()]).double()


def _logistic_optimum(sites):
    """Newton's method on mean_k BCE_k(theta) + WD/2 ||theta||^2 (weights and bias), float64."""
    xs = [torch.cat([x.double(), torch.ones(len(x), 1, dtype=torch.float64)], 1) for x, _ in sites]
    ys = [y.double().flatten() for _, y in sites]
    theta = torch.zeros(D + 1, dtype=torch.float64)
    for _ in range(50):
        grad = WD * theta
        hess = WD * torch.eye(D + 1, dtype=torch.float64)
        for x, y in zip(xs, ys):
            p = torch.sigmoid(x @ theta)
            grad = grad + x.T @ (p - y) / len(y) / K
            hess = hess + (x.T * (p * (1 - p))) @ x / len(y) / K
        theta = theta - torch.linalg.solve(hess, grad)
    assert grad.norm() < 1e-10
    return theta


def test_fedavg_drifts_with_local_steps_and_scaffold_does_not(sites):
    optimum = _logistic_optimum(sites)
    params = {"weight_decay": WD}
    dist = {(alg, I): float((_run(sites, alg, I, rounds, 0.4, params) - optimum).norm()) for alg, I, rounds in
            [("fedavg", 1, 640), ("fedavg", 8, 80), ("fedavg", 32, 24), ("scaffold", 8, 80), ("scaffold", 32, 40)]}
    # I = 1 is centralized full-batch gradient descent (SCAFFOLD with I = 1 is the same computation).
    assert dist["fedavg", 1] < 1e-4
    assert dist["fedavg", 8] > 0.1
    assert dist["fedavg", 32] > 1.2 * dist["fedavg", 8]
    assert dist["scaffold", 8] < 1e-3
    assert dist["scaffold", 32] < 0.1 * dist["fedavg", 32]


def _auc_m_saddle(sites, prior, margin):
    """The point where grad_v (F + WD_AUC/2 ||v||^2) = 0 and alpha = m + b - a, for the pooled linear-score
    AUC-M objective F = mean_k F_k: the fixed point of full-batch CODA+ with I = 1. F is quadratic in
    v = (w, bias, a, b) and alpha, so the conditions are affine in z = (v, alpha): one linear solve."""
    xs = [x.double() for x, _ in sites]
    ys = [y.double() for _, y in sites]

    def conditions(z):
        a, b, alpha = z[D + 1:D + 2], z[D + 2:D + 3], z[D + 3:]
        def objective(v):
            return sum(auc_margin_loss((x @ v[:D] + v[D])[:, None], y, v[D + 1:D + 2], v[D + 2:D + 3], alpha,
                                       prior, margin) for x, y in zip(xs, ys)) / K + WD_AUC / 2 * v.pow(2).sum()
        grad_v = torch.func.grad(objective)(z[:D + 3])
        return torch.cat([grad_v, alpha - (margin + b - a)])

    z0 = torch.zeros(D + 4, dtype=torch.float64)
    jac = torch.func.jacrev(conditions)(z0)
    z = torch.linalg.solve(jac, -conditions(z0))
    assert conditions(z).abs().max() < 1e-10 and z[-1] > 0  # alpha > 0: the clamp is inactive
    return z


def test_codaplus_drifts_with_local_steps_and_codasca_does_not(sites):
    labels = torch.cat([y for _, y in sites])
    prior = labels.mean().double().reshape(1)
    saddle = _auc_m_saddle(sites, prior, 1.0)
    params = {"gamma": None, "clip": None, "weight_decay": WD_AUC, "score": "identity", "stages": 1}

    def dist(alg, I, rounds):
        cfg = TrainConfig(algorithm=alg, params=params, sites=[TensorSite(train=s) for s in sites],
                          network="linear", rounds=rounds, local_steps=I, batch_size=N, lr=0.15,
                          progress=False, loader_workers=0)
        result = federated.train(cfg)
        st = result.site_states[0]
        got = torch.cat([result.global_state["1.weight"].flatten(), result.global_state["1.bias"],
                         st["a"], st["b"], st["alpha"]]).double()
        return float((got - saddle).norm())

    d = {(alg, I): dist(alg, I, rounds) for alg, I, rounds in
         [("codaplus", 8, 64), ("codaplus", 32, 16), ("codasca", 8, 64), ("codasca", 32, 24)]}
    # CODASCA reaching the saddle at I = 8 also confirms the reference point.
    assert d["codasca", 8] < 1e-3
    assert d["codaplus", 8] > 0.1
    assert d["codaplus", 32] > 1.1 * d["codaplus", 8]
    assert d["codasca", 32] < 0.2 * d["codaplus", 32]
