"""LocalSCGDAM and LocalSGDAM (docs/algorithms.md sections 1.3 and 6): the exact Jacobian against a finite-difference
Jacobian-vector product, the update rules against the chain rule and the AUC-square closed forms,
BatchNorm running statistics, masked diseases."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from federated import SyntheticSite, TensorSite, TrainConfig
from federated.engine import Engine
from models.compositional import functional_forward, inner_ce_step
from models.objectives import auc_square_loss

C = 2


def make_engine(algorithm: str, params: dict | None = None, sites=None, network: str = "mlp"):
    sites = sites or [SyntheticSite(n_train=40, shape=(4,), num_classes=C, pos_rate=0.4, task_seed=5, shift=0.3)
                      for _ in range(2)]
    cfg = TrainConfig(algorithm=algorithm, params=params or {}, sites=sites, network=network,
                      network_kwargs={"hidden": 6} if network == "mlp" else {}, rounds=1, local_steps=2,
                      batch_size=12, lr=0.3, loader_workers=0, progress=False)
    return Engine(cfg)


def to_double(site):
    site.model.double()
    site.state = {k: v.double() for k, v in site.state.items()}


def test_exact_jacobian_matches_finite_difference_jvp_through_batchnorm():
    eng = make_engine("localscgdam", {"rho": 0.7})
    alg, site = eng.algorithm, eng.sites[0]
    to_double(site)
    batch = next(site.loader.batches(1))
    x = batch.x.double()
    batch.x = x
    gen = torch.Generator().manual_seed(0)
    params = list(site.model.parameters())
    z = [torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in params]
    d = [torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in params]
    _, jacobian_t = alg.outer_point(site, batch, first=True)
    jz = jacobian_t(z)
    eps = 1e-5

    def g_at(sign):
        with torch.no_grad():
            for p, di in zip(params, d):
                p.add_(sign * eps * di)
        g = inner_ce_step(site.model, x, batch.y.double(), 0.7, batch.mask)
        with torch.no_grad():
            for p, di in zip(params, d):
                p.sub_(sign * eps * di)
        return [t.detach() for t in g.values()]

    jvp = [(gp - gm) / (2 * eps) for gp, gm in zip(g_at(1), g_at(-1))]
    lhs = sum((a * b).sum() for a, b in zip(jz, d))  # <J^T z, d>
    rhs = sum((a * b).sum() for a, b in zip(z, jvp))  # <z, J d>
    assert torch.isclose(lhs, rhs, rtol=1e-6), (lhs, rhs)
    first_order = sum((a * b).sum() for a, b in zip(z, d))
    assert not torch.isclose(lhs, first_order, rtol=1e-3)  # the Hessian term is really there


def test_initialisation_is_the_chain_rule_and_leaves_bn_statistics_to_x():
    eng = make_engine("localscgdam", {"rho": 0.5, "jacobian": "exact"})
    alg, site = eng.algorithm, eng.sites[0]
    batch = next(site.loader.batches(1))
    reference = copy.deepcopy(site.model)
    params = list(reference.parameters())
    g = inner_ce_step(reference, batch.x, batch.y, 0.5, batch.mask, create_graph=True)
    a, b, alpha = (torch.zeros(C, requires_grad=True) for _ in range(3))
    s = torch.sigmoid(functional_forward(reference, g, batch.x))
    F = auc_square_loss(s, batch.y, a, b, alpha, site.prior, mask=batch.mask)
    chain = torch.autograd.grad(F, params + [a, b])
    reference.train()(batch.x)  # the one forward at x that may move the running statistics

    alg.estimate(site, batch, first=True)
    u = [site.state[f"u.{n}"] for n in alg.x_names(site)]
    for got, want in zip(u, chain):
        assert torch.allclose(got, want, atol=1e-6)
    # v = grad_alpha f at h = g(x0): closed form of 1.1, alpha = 0: mean_i 2(p s [y=0] - (1-p) s [y=1]) / C
    p, s = site.prior, s.detach()
    y, m = batch.y, batch.mask
    closed = (2 * (p * s * (1 - y) - (1 - p) * s * y) * m).sum(0) / m.sum(0) / C
    assert torch.allclose(site.state["v"], closed, atol=1e-6)
    for name, buf in reference.named_buffers():
        assert torch.equal(dict(site.model.named_buffers())[name], buf), name
    h = [site.state[f"h.{n}"] for n in alg.x_names(site)]
    for got, want in zip(h, list(g.values())):
        assert torch.allclose(got, want.detach(), atol=1e-6)


def test_local_step_moves_with_old_momenta_and_averages_new_estimates():
    params = {"rho": 0.4, "jacobian": "first_order", "h_rate": 0.3, "beta_x": 0.6, "beta_y": 0.2, "dual_lr": 0.05}
    eng = make_engine("localscgdam", params)  # the engine has initialised h, u, v on a batch of their own
    alg, site = eng.algorithm, eng.sites[0]
    b1 = next(site.loader.batches(1))
    before = {k: v.clone() for k, v in site.state.items()}
    x0 = [t.detach().clone() for t in alg.x(site)]
    alg.local_step(site, b1)
    names = alg.x_names(site)
    x1 = [t - 0.3 * before[f"u.{n}"] for t, n in zip(x0, names)]
    for got, want in zip(alg.x(site), x1):
        assert torch.allclose(got.detach(), want, atol=1e-6)
    alpha1 = before["alpha"] + 0.05 * before["v"]
    assert torch.allclose(site.state["alpha"], alpha1, atol=1e-7)
    model = copy.deepcopy(site.model)
    g = inner_ce_step(model, b1.x, b1.y, 0.4, b1.mask)
    g_all = [t.detach() for t in g.values()] + x1[-2:]
    h1 = [(1 - 0.3) * before[f"h.{n}"] + 0.3 * gi for n, gi in zip(names, g_all)]
    for n, want in zip(names, h1):
        assert torch.allclose(site.state[f"h.{n}"], want, atol=1e-6)
    leaves = [t.clone().requires_grad_() for t in h1]
    alpha = alpha1.clone().requires_grad_()
    s = torch.sigmoid(functional_forward(model, dict(zip([n for n, _ in model.named_parameters()], leaves[:-2])), b1.x))
    F = auc_square_loss(s, b1.y, leaves[-2], leaves[-1], alpha, site.prior, mask=b1.mask)
    z = torch.autograd.grad(F, leaves + [alpha])
    for n, zi in zip(names, z[:-1]):  # first order: J_g = I
        assert torch.allclose(site.state[f"u.{n}"], 0.4 * before[f"u.{n}"] + 0.6 * zi, atol=1e-6)
    assert torch.allclose(site.state["v"], 0.8 * before["v"] + 0.2 * z[-1], atol=1e-6)


def test_localsgdam_is_momentum_sgda_at_x_without_h():
    eng = make_engine("localsgdam", {"beta_x": 0.5})
    alg, site = eng.algorithm, eng.sites[0]
    assert not any(k.startswith("h.") for k in site.state)
    batch = next(site.loader.batches(1))
    reference = copy.deepcopy(site.model)
    a, b, alpha = (torch.zeros(C, requires_grad=True) for _ in range(3))
    F = auc_square_loss(torch.sigmoid(reference(batch.x)), batch.y, a, b, alpha, site.prior, mask=batch.mask)
    grads = torch.autograd.grad(F, list(reference.parameters()) + [a, b])
    alg.estimate(site, batch, first=True)
    for n, want in zip(alg.x_names(site), grads):
        assert torch.allclose(site.state[f"u.{n}"], want, atol=1e-6)
    for name, buf in reference.named_buffers():  # the forward at x owns the running statistics
        assert torch.equal(dict(site.model.named_buffers())[name], buf), name
    scgdam = make_engine("localscgdam")
    extra = sum(t.numel() for n, t in scgdam.sites[0].state.items() if n.startswith("h."))
    assert extra == sum(p.numel() for p in site.model.parameters()) + 2 * C  # h is what LocalSGDAM does not send


@pytest.mark.parametrize("algorithm", ["localscgdam", "localsgdam"])
def test_the_first_round_makes_i_updates_after_a_separate_initialisation(algorithm):
    """The paper initialises h, u, v on a minibatch of its own and then takes I steps before communicating.
    With I = 1 the one local step of round 0 must move x by -lr u0 and alpha by dual_lr v0 (had the
    initialisation been one of the I steps, round 0 would end where it started)."""
    x = torch.tensor(np.random.default_rng(3).standard_normal((20, 4)), dtype=torch.float32)
    y = torch.tensor((np.random.default_rng(4).random((20, C)) < 0.4), dtype=torch.float32)
    cfg = TrainConfig(algorithm=algorithm, params={"dual_lr": 0.5}, sites=[TensorSite(train=(x, y))],
                      network="linear", rounds=1, local_steps=1, batch_size=10, lr=0.3, loader_workers=0,
                      progress=False)
    eng = Engine(cfg)
    alg, site = eng.algorithm, eng.sites[0]
    x0 = [t.detach().clone() for t in alg.x(site)]
    u0 = [t.clone() for t in alg.group(site, "u")]
    v0 = site.state["v"].clone()
    assert all(bool(t.abs().sum() > 0) for t in u0) and bool(v0.abs().sum() > 0)
    result = eng.run()
    weights = [result.global_state[n] for n, _ in site.model.named_parameters()]
    for got, start, u in zip(weights + [result.site_states[0]["a"], result.site_states[0]["b"]], x0, u0):
        torch.testing.assert_close(got, start - 0.3 * u)
    torch.testing.assert_close(result.site_states[0]["alpha"], 0.5 * v0)


def test_masked_disease_keeps_its_dual_still():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((30, 4)).astype(np.float32)
    y = (rng.random((30, C)) < 0.4).astype(np.float32)
    y_masked = y.copy()
    y_masked[:, 1] = np.nan
    eng = make_engine("localscgdam", sites=[TensorSite(train=(x, y_masked)), TensorSite(train=(x, y))])
    alg, site = eng.algorithm, eng.sites[0]
    for batch in site.loader.batches(3):
        loss = alg.local_step(site, batch)
        site.iteration += 1
        assert torch.isfinite(loss)
    assert site.state["v"][1] == 0 and site.state["alpha"][1] == 0 and site.state["v"][0] != 0
