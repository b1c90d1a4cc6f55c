"""FedSGDA+ and FedSGDA-M (docs/algorithms.md section 8) and the ratio-loss baseline LocalSGDM_RL (1.6): the steps against
the AUC-square loss written out sample by sample, server step sizes, the anchor, STORM's two-point
correction and the previous iterate after a sync."""

from __future__ import annotations

import math

import torch

from federated import SyntheticSite, TrainConfig, train
from federated.engine import Engine

C, LR = 2, 0.2


def config(algorithm: str, params: dict | None = None, rounds: int = 1, local_steps: int = 2) -> TrainConfig:
    sites = [SyntheticSite(n_train=30, shape=(3,), num_classes=C, pos_rate=0.4, task_seed=7, shift=0.5 * k)
             for k in range(2)]
    return TrainConfig(algorithm=algorithm, params=params or {}, sites=sites, network="linear", rounds=rounds,
                       local_steps=local_steps, batch_size=10, lr=LR, loader_workers=0, progress=False)


def auc_square_loop(w, bias, x, y, mask, a, b, alpha, p):
    """docs/algorithms.md section 1.1 sample by sample: per disease the mean over its present samples, then the mean over C."""
    total = 0
    for c in range(C):
        terms = []
        for i in range(len(x)):
            if mask[i, c] == 0:
                continue
            s = torch.sigmoid(x[i] @ w[c] + bias[c])
            pc = float(p[c])
            if y[i, c] == 1:
                terms.append((1 - pc) * (s - a[c]) ** 2 - 2 * (1 + alpha[c]) * (1 - pc) * s - pc * (1 - pc) * alpha[c] ** 2)
            else:
                terms.append(pc * (s - b[c]) ** 2 + 2 * (1 + alpha[c]) * pc * s - pc * (1 - pc) * alpha[c] ** 2)
        has_both = any(y[i, c] == 1 and mask[i, c] for i in range(len(x))) and \
            any(y[i, c] == 0 and mask[i, c] for i in range(len(x)))
        if has_both:
            total = total + sum(terms) / len(terms)
    return total / C


def grads_at(point, batch, p):
    """Gradient of the loop loss at point = [weight, bias, a, b, alpha]."""
    leaves = [t.detach().clone().requires_grad_() for t in point]
    return torch.autograd.grad(auc_square_loop(*leaves[:2], batch.x, batch.y, batch.mask, *leaves[2:], p), leaves)


def test_fedsgda_plus_descends_x_and_ascends_alpha_at_the_anchor():
    eng = Engine(config("fedsgda_plus", {"dual_lr": 0.3}))
    alg, site = eng.algorithm, eng.sites[0]
    b0, b1 = list(site.loader.batches(2))
    x0 = [t.detach().clone() for t in alg.x(site)] + [site.state["alpha"].clone()]
    alg.local_step(site, b0)
    g0 = grads_at(x0, b0, site.prior)
    x1 = [t - LR * g for t, g in zip(x0[:4], g0[:4])] + [x0[4] + 0.3 * g0[4]]
    for got, want in zip(alg.x(site) + [site.state["alpha"]], x1):
        assert torch.allclose(got.detach(), want, atol=1e-6)
    alg.local_step(site, b1)
    g1 = grads_at(x1, b1, site.prior)
    g_anchor = grads_at(x0[:2] + x1[2:], b1, site.prior)  # dual gradient with the anchor's (round-start) network
    assert not torch.allclose(g1[4], g_anchor[4])
    assert torch.allclose(site.state["alpha"], x1[4] + 0.3 * g_anchor[4], atol=1e-6)
    for got, want, g in zip(alg.x(site), x1[:4], g1[:4]):
        assert torch.allclose(got.detach(), want - LR * g, atol=1e-6)


def test_server_step_sizes_extrapolate_the_site_mean():
    x0 = Engine(config("fedsgda_plus")).sites[0].model.state_dict()
    plain = train(config("fedsgda_plus"))
    extrapolated = train(config("fedsgda_plus", {"eta_x": 2.0, "eta_y": 3.0}))
    for name, start in x0.items():
        want = start + 2.0 * (plain.global_state[name] - start)
        assert torch.allclose(extrapolated.global_state[name], want, atol=1e-6)
    alpha = plain.site_states[0]["alpha"]
    assert torch.allclose(extrapolated.site_states[0]["alpha"], 3.0 * alpha, atol=1e-6)  # alpha_0 = 0
    assert torch.allclose(extrapolated.site_states[1]["a"], 2.0 * plain.site_states[1]["a"], atol=1e-6)


def test_anchor_is_refreshed_every_s_rounds():
    eng = Engine(config("fedsgda_plus", {"anchor_every": 2}, rounds=2))
    start = eng.sites[0].state["anchor.w.1.weight"].clone()
    rounds = []
    eng.run([lambda record: rounds.append(eng.sites[0].state["anchor.w.1.weight"].clone())])
    assert torch.equal(rounds[0], start)  # after round 1 of 2: not yet
    assert torch.equal(rounds[1], eng.sites[0].model[1].weight.detach())


def test_fedsgda_m_storm_correction_uses_the_previous_iterate_on_the_same_batch():
    eng = Engine(config("fedsgda_m", {"storm_x": 0.3, "storm_y": 0.6, "dual_lr": 0.4}))
    alg, site = eng.algorithm, eng.sites[0]
    b0, b1 = list(site.loader.batches(2))
    x0 = [t.detach().clone() for t in alg.x(site)] + [site.state["alpha"].clone()]
    alg.local_step(site, b0)
    site.iteration += 1
    u0 = grads_at(x0, b0, site.prior)  # t = 0: u and v are the plain stochastic gradients
    x1 = [t - LR * g for t, g in zip(x0[:4], u0[:4])] + [x0[4] + 0.4 * u0[4]]
    alg.local_step(site, b1)
    fresh, old = grads_at(x1, b1, site.prior), grads_at(x0, b1, site.prior)
    u1 = [f + (1 - 0.3) * (u - o) for f, u, o in zip(fresh[:4], u0[:4], old[:4])]
    v1 = fresh[4] + (1 - 0.6) * (u0[4] - old[4])
    for n, want in zip(alg.x_names(site), u1):
        assert torch.allclose(site.state[f"u.{n}"], want, atol=1e-6)
    assert torch.allclose(site.state["v"], v1, atol=1e-6)
    for got, start, u in zip(alg.x(site), x1[:4], u1):
        assert torch.allclose(got.detach(), start - LR * u, atol=1e-6)
    for n, want in zip(alg.x_names(site) + ["alpha"], x1):
        assert torch.allclose(site.state[f"prev.{n}"], want, atol=1e-7)


def test_fedsgda_m_syncs_x_u_v_and_keeps_each_sites_previous_iterate():
    result = train(config("fedsgda_m", rounds=1))
    s0, s1 = result.site_states[0], result.site_states[1]
    for name in s0:
        same = torch.equal(s0[name], s1[name])
        assert same == (not name.startswith("prev.")), name


def test_ratio_loss_weights_positives_by_the_global_class_ratio():
    eng = Engine(config("localsgdm_rl"))
    alg, site = eng.algorithm, eng.sites[0]
    batch = next(site.loader.batches(1))
    ratio = eng.fed.negatives / eng.fed.positives
    total = 0.0
    for c in range(C):
        terms = []
        for i in range(len(batch.x)):
            z = float(site.model(batch.x[i : i + 1])[0, c].detach())
            if batch.y[i, c] == 1:
                terms.append((1 + 0.1 * float(ratio[c])) * math.log1p(math.exp(-z)))
            else:
                terms.append(math.log1p(math.exp(z)))
        total += sum(terms) / len(terms)
    assert math.isclose(float(alg.loss(site, batch).detach()), total / C, rel_tol=1e-5)
