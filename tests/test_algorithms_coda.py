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
    params = {"clip": 0.05, "gamma": 2.0, "weight_decay": 0.1}
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


def test_stage_boundary_divides_lr_and_averages_the_stage_iterates_into_v_ref():
    data = _data(2)
    params = {"clip": None, "gamma": 4.0, "weight_decay": 0.0, "T0": 2}
    cfg = _cfg("codaplus", data, I=1, rounds=3, params=params)
    w0, b0 = _initial(cfg)
    v = [w0, b0, torch.zeros(1), torch.zeros(1)]
    ref, alpha, lr, iterates = [t.clone() for t in v], torch.zeros(1), LR, []
    for t in range(3):
        steps = [_codaplus_step(v, ref, alpha, x, y, _prior(data), lr, 1e9, 0.25, 0.0) for x, y in data]
        v = [torch.stack([s[0][i] for s in steps]).mean(0) for i in range(4)]
        alpha = torch.stack([s[1] for s in steps]).mean(0)
        # Each site's iterate enters its stage sum before averaging; the stage mean is then averaged.
        iterates.append([torch.stack([s[0][i] for s in steps]).mean(0) for i in range(4)])
        if t == 1:
            ref = [torch.stack([it[i] for it in iterates]).mean(0) for i in range(4)]
            lr = lr / 3
    result = federated.train(cfg)
    got_v, _ = _state(result)
    for got, want in zip(got_v, v):
        torch.testing.assert_close(got.reshape(want.shape), want, atol=1e-6, rtol=1e-5)
    assert float(result.site_states[0]["lr"]) == pytest.approx(LR / 3)
    torch.testing.assert_close(result.site_states[1]["ref.a"], ref[2], atol=1e-6, rtol=1e-5)


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
    base = {"clip": None, "gamma": None, "weight_decay": 0.0}
    plus = federated.train(_cfg("codaplus", data, I=3, rounds=1, params=base))
    sca = federated.train(_cfg("codasca", data, I=3, rounds=1, params={**base, "eta_g": 2.0}))
    w0, b0 = _initial(_cfg("codaplus", data, I=3, rounds=1, params=base))
    v0 = [w0, b0, torch.zeros(1), torch.zeros(1)]
    v_plus, alpha_plus = _state(plus)
    v_sca, alpha_sca = _state(sca)
    for start, mean, got in zip(v0, v_plus, v_sca):
        torch.testing.assert_close(got, start + 2.0 * (mean - start), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(alpha_sca, (2.0 * alpha_plus).clamp(0, 999), atol=1e-6, rtol=1e-5)
