"""CODA+, CoDA and CODASCA update rules (docs/algorithms.md sections 1.2 and 5), against the equations
written out here step by step (gradients of the AUC-M loss by autograd, everything else by hand)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import federated
from federated import TensorSite, TrainConfig
from federated.engine import Engine
from models.objectives import auc_margin_loss

N, D, LR, M = 24, 3, 0.5, 1.0



def _data(K):
    rng = np.random.default_rng(11)
    out = []
    for k in range(K):
        x = torch.tensor(rng.standard_normal((N, D)) + 0.5 * k, dtype=torch.float32)
        y = torch.tensor((rng.random((N, 1)) < 0.3).astype(np.float32))
        y[0], y[1] = 1.0, 0.0
        out.append((x, y))
    return out


def _cfg(algorithm, data, I, rounds, params):
    return TrainConfig(algorithm=algorithm, params=params, network="linear", rounds=rounds, local_steps=I,
                       batch_size=N, lr=LR, progress=False, loader_workers=0,
                       sites=[TensorSite(train=d) for d in data])


def _prior(data):
    return torch.cat([y for _, y in data]).mean().reshape(1)


def _initial(cfg):
    layer = Engine(cfg).sites[0].model[1]
    return layer.weight.detach().clone(), layer.bias.detach().clone()


def _codaplus_step(v, ref, alpha, x, y, prior, lr, clip, prox, wd):
    """One CODA+ local step, written from section 5. v = [w, bias, a, b]."""
    v = [t.clone().requires_grad_() for t in v]
    w, bias, a, b = v
    loss = auc_margin_loss(torch.sigmoid(x @ w.T + bias), y, a, b, alpha, prior, M)
    g = torch.autograd.grad(loss, v)
    new = []
    for i, (t, gi, r) in enumerate(zip(v, g, ref)):
        gi = gi.clamp(-clip, clip) if i < 2 else gi  # clip the network weights, not a and b
        new.append((t - lr * (gi + prox * (t - r)) - lr * wd * t).detach())
    a_new, b_new = new[2], new[3]
    alpha = (alpha + lr * (2 * (M + b_new - a_new) - 2 * alpha)).clamp(0, 999)
    return new, alpha


def _state(result, k=0):
    st = result.site_states[k]
    return [result.global_state["1.weight"], result.global_state["1.bias"], st["a"], st["b"]], st["alpha"]


def test_codaplus_local_steps_clip_prox_weight_decay_and_closed_form_dual():
    data = _data(1)
    params = {"clip": 0.05, "gamma": 2.0, "weight_decay": 0.1, "stages": 1}
    cfg = _cfg("codaplus", data, I=3, rounds=1, params=params)
    w0, b0 = _initial(cfg)
    v = [w0, b0, torch.zeros(1), torch.zeros(1)]
    ref = [t.clone() for t in v]  # v_ref starts at v0
    alpha = torch.zeros(1)
    x, y = data[0]
    for _ in range(3):
        v, alpha = _codaplus_step(v, ref, alpha, x, y, _prior(data), LR, 0.05, 0.5, 0.1)
    got_v, got_alpha = _state(federated.train(cfg))
    for got, want in zip(got_v, v):
        torch.testing.assert_close(got.reshape(want.shape), want, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got_alpha, alpha, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("restart", [True, False])
def test_stage_boundary_divides_lr_and_averages_the_stage_iterates_into_v_ref(restart):
    """At a stage boundary v_ref moves to the stage's mean iterate; with ``stage_restart`` (the paper's
    Algorithm, default) v and alpha restart from that mean, without it (the authors' code) they carry on."""
    data = _data(2)
    params = {"clip": None, "gamma": 4.0, "weight_decay": 0.0, "T0": 2, "lr_decay": 3.0, "stage_restart": restart}
    cfg = _cfg("codaplus", data, I=1, rounds=3, params=params)
    w0, b0 = _initial(cfg)
    v = [w0, b0, torch.zeros(1), torch.zeros(1)]
    ref, alpha, lr, iterates, alphas = [t.clone() for t in v], torch.zeros(1), LR, [], []
    for t in range(3):
        steps = [_codaplus_step(v, ref, alpha, x, y, _prior(data), lr, 1e9, 0.25, 0.0) for x, y in data]
        v = [torch.stack([s[0][i] for s in steps]).mean(0) for i in range(4)]
        alpha = torch.stack([s[1] for s in steps]).mean(0)
        # Each site's iterate enters its stage sum before averaging; the stage mean is then averaged.
        iterates.append(v)
        alphas.append(alpha)
        if t == 1:
            ref = [torch.stack([it[i] for it in iterates]).mean(0) for i in range(4)]
            lr = lr / 3
            if restart:
                v, alpha = [r.clone() for r in ref], torch.stack(alphas).mean(0)
    result = federated.train(cfg)
    got_v, got_alpha = _state(result)
    for got, want in zip(got_v, v):
        torch.testing.assert_close(got.reshape(want.shape), want, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got_alpha, alpha, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(result.site_states[1]["ref.a"], ref[2], atol=1e-6, rtol=1e-5)
    assert ("stage_sum.alpha" in result.site_states[0]) == restart  # alpha's stage mean only when restarting


def test_coda_resets_alpha_from_pooled_class_means():
    data = _data(2)
    cfg = _cfg("coda", data, I=1, rounds=1, params={"T0": 1})
    w0, b0 = _initial(cfg)
    # Stage 1 is the single step at w0: its scores over both sites' full batches, pooled by class.
    s = torch.cat([torch.sigmoid(x @ w0.T + b0) for x, _ in data])
    y = torch.cat([yy for _, yy in data])
    want = (M + s[y == 0].mean() - s[y == 1].mean()).clamp_min(0)
    result = federated.train(cfg)
    for k in range(2):
        torch.testing.assert_close(result.site_states[k]["alpha"], want.reshape(1), atol=1e-6, rtol=1e-5)


def test_codasca_first_round_is_codaplus_and_eta_g_extrapolates():
    data = _data(2)
    base = {"clip": None, "gamma": None, "weight_decay": 0.0, "stages": 1}
    plus = federated.train(_cfg("codaplus", data, I=3, rounds=1, params=base))
    sca = federated.train(_cfg("codasca", data, I=3, rounds=1, params={**base, "eta_g": 2.0}))
    w0, b0 = _initial(_cfg("codaplus", data, I=3, rounds=1, params=base))
    v0 = [w0, b0, torch.zeros(1), torch.zeros(1)]
    v_plus, alpha_plus = _state(plus)
    v_sca, alpha_sca = _state(sca)
    for start, mean, got in zip(v0, v_plus, v_sca):
        torch.testing.assert_close(got, start + 2.0 * (mean - start), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(alpha_sca, (2.0 * alpha_plus).clamp(0, 999), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("restart", [True, False])
def test_codasca_stage_restart_resets_the_control_variates(restart):
    """The paper's stage is a fresh run of its inner algorithm: at the boundary the iterate is the stage
    mean (= v_ref), the global step's anchor is that point and every control variate is 0 again; the
    authors' code keeps the variates and the iterate."""
    data = _data(2)
    params = {"clip": None, "gamma": 4.0, "weight_decay": 0.0, "T0": 2, "eta_g": 1.5, "stage_restart": restart}
    result = federated.train(_cfg("codasca", data, I=1, rounds=2, params=params))
    for k in range(2):
        st = result.site_states[k]
        variates = [t for n, t in st.items() if n.startswith(("c.", "c_site."))]
        assert len(variates) == 2 * 5  # w, bias, a, b, alpha
        assert all(bool((t == 0).all()) for t in variates) == restart
        for n in ("a", "b", "alpha"):
            torch.testing.assert_close(st[f"prev_global.{n}"], st[n])
        assert torch.equal(st["ref.a"], st["a"]) == restart
    got_w = result.global_state["1.weight"].reshape(-1)
    assert torch.allclose(got_w, result.site_states[0]["ref.w.1.weight"].reshape(-1)) == restart


@pytest.mark.parametrize("dual_variate", ["pre_step", "post_step"])
def test_codasca_dual_variate_is_the_mean_d_alpha_at_the_chosen_alpha(dual_variate):
    """c_k,alpha is the mean of the round's d_alpha = 2(m + b - a) - 2 alpha at the updated a, b and at the
    alpha the step ascended from (the paper's rule, default) or, as the authors' code, the alpha after it."""
    data = _data(2)
    params = {"clip": None, "gamma": None, "weight_decay": 0.0, "stages": 1, "dual_variate": dual_variate}
    result = federated.train(_cfg("codasca", data, I=3, rounds=1, params=params))
    w0, b0 = _initial(_cfg("codasca", data, I=3, rounds=1, params=params))
    for k, (x, y) in enumerate(data):
        v, alpha, pre, post = [w0, b0, torch.zeros(1), torch.zeros(1)], torch.zeros(1), [], []
        for _ in range(3):  # the first round of CODASCA is CODA+'s (c = c_k = 0)
            before = alpha
            v, alpha = _codaplus_step(v, v, alpha, x, y, _prior(data), LR, 1e9, 0.0, 0.0)
            pre.append(2 * (M + v[3] - v[2]) - 2 * before)
            post.append(2 * (M + v[3] - v[2]) - 2 * alpha)
        want, other = (pre, post) if dual_variate == "pre_step" else (post, pre)
        got = result.site_states[k]["c_site.alpha"]
        torch.testing.assert_close(got, torch.stack(want).mean(0), atol=1e-6, rtol=1e-5)
        assert not torch.allclose(got, torch.stack(other).mean(0), atol=1e-4)


def test_codasca_post_step_variate_needs_the_closed_form_dual():
    with pytest.raises(ValueError, match="closed_form"):
        federated.train(_cfg("codasca", _data(1), I=1, rounds=1,
                             params={"dual_variate": "post_step", "dual": "gradient"}))
