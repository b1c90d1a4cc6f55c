"""Objectives (docs/algorithms.md section 1) against brute-force references written as explicit loops, and finite differences."""

import copy
import math

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score
from torch import nn

from models.compositional import functional_forward, inner_ce_step, inner_ce_step_vjp, trainable_parameters
from models.objectives import (
    SURROGATES,
    CVaROPAUCLoss,
    KLOPAUCLoss,
    KLTPAUCLoss,
    auc_margin_dual_direction,
    auc_margin_loss,
    auc_square_loss,
    clamp_alpha,
    cvar_opauc_surrogate,
    cvar_threshold_gradient,
    defined_diseases,
    get_surrogate,
    kl_opauc_ema,
    kl_opauc_inner_mean,
    kl_opauc_surrogate,
    masked_bce_with_logits,
    pairwise_auc_loss,
    ratio_loss,
    ratio_positive_weight,
)


def make_batch(n=12, c=3, seed=0, dtype=torch.float64):
    """Scores in (0,1), labels with both classes for diseases 0 and 1, NaN-missing and masked entries."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.rand(n, c, generator=g, dtype=dtype) * 0.98 + 0.01
    labels = (torch.rand(n, c, generator=g) < 0.4).to(dtype)
    labels[0, :] = 1
    labels[1, :] = 0
    labels[2, 0] = float("nan")
    mask = torch.ones(n, c, dtype=torch.bool)
    mask[3, min(1, c - 1)] = False
    return scores, labels, mask


def present(labels, mask, i, c):
    return bool(mask[i, c]) and not math.isnan(float(labels[i, c]))


# --- brute-force references: plain Python loops over samples and pairs -----------------------------


def loop_minmax(scores, labels, mask, a, b, alpha, p, margin, kind):
    n, c_count = scores.shape
    total = []
    for c in range(c_count):
        rows = [i for i in range(n) if present(labels, mask, i, c)]
        n_pos = sum(1 for i in rows if labels[i, c] == 1)
        if n_pos == 0 or n_pos == len(rows):
            total.append(0.0)
            continue
        acc = 0.0
        for i in rows:
            s, y = float(scores[i, c]), float(labels[i, c])
            if kind == "square":
                acc += ((1 - p[c]) * (s - a[c]) ** 2 * y + p[c] * (s - b[c]) ** 2 * (1 - y)
                        + 2 * (1 + alpha[c]) * (p[c] * s * (1 - y) - (1 - p[c]) * s * y) - p[c] * (1 - p[c]) * alpha[c] ** 2)
            else:
                acc += ((1 - p[c]) * (s - a[c]) ** 2 * y + p[c] * (s - b[c]) ** 2 * (1 - y)
                        + 2 * alpha[c] * (p[c] * (1 - p[c]) * margin + p[c] * s * (1 - y) - (1 - p[c]) * s * y)
                        - p[c] * (1 - p[c]) * alpha[c] ** 2)
        total.append(acc / len(rows))
    return total


def loop_pairwise(scores, labels, mask, loss_of_t):
    n, c_count = scores.shape
    out = []
    for c in range(c_count):
        pos = [i for i in range(n) if present(labels, mask, i, c) and labels[i, c] == 1]
        neg = [j for j in range(n) if present(labels, mask, j, c) and labels[j, c] == 0]
        if not pos or not neg:
            out.append(0.0)
            continue
        out.append(sum(loss_of_t(float(scores[i, c] - scores[j, c])) for i in pos for j in neg) / (len(pos) * len(neg)))
    return out


SCALAR_SURROGATES = {
    "squared_hinge": lambda t: max(1.0 - t, 0.0) ** 2,
    "square": lambda t: (1.0 - t) ** 2,
    "hinge": lambda t: max(1.0 - t, 0.0),
    "logistic": lambda t: math.log(1 + math.exp(-t / 1.0)),
    "sigmoid": lambda t: 1 / (1 + math.exp(2.0 * t)),
}


def params(c=3, dtype=torch.float64):
    a = torch.tensor([0.6, 0.7, 0.5], dtype=dtype)[:c].requires_grad_()
    b = torch.tensor([0.3, 0.2, 0.4], dtype=dtype)[:c].requires_grad_()
    alpha = torch.tensor([0.5, 1.2, 0.1], dtype=dtype)[:c].requires_grad_()
    prior = torch.tensor([0.3, 0.1, 0.45], dtype=dtype)[:c]
    return a, b, alpha, prior


# --- 1.1 / 1.2 -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["square", "margin"])
def test_minmax_losses_match_loop_reference(kind):
    scores, labels, mask = make_batch()
    labels[:, 2] = 1  # disease 2 has no negative: undefined, contributes 0
    a, b, alpha, prior = params()
    if kind == "square":
        got = auc_square_loss(scores, labels, a, b, alpha, prior, mask=mask, reduction="none")
    else:
        got = auc_margin_loss(scores, labels, a, b, alpha, prior, margin=0.8, mask=mask, reduction="none")
    ref = loop_minmax(scores, labels, mask, a.tolist(), b.tolist(), alpha.tolist(), prior.tolist(), 0.8, kind)
    assert got.tolist() == pytest.approx(ref, rel=1e-12)
    assert got[2].item() == 0.0
    mean = auc_margin_loss if kind == "margin" else auc_square_loss
    kwargs = {"margin": 0.8} if kind == "margin" else {}
    assert mean(scores, labels, a, b, alpha, prior, mask=mask, **kwargs).item() == pytest.approx(sum(ref) / 3)


@pytest.mark.parametrize("loss", [auc_square_loss, auc_margin_loss])
def test_minmax_gradients_match_finite_differences(loss):
    scores, labels, mask = make_batch(n=8)
    a, b, alpha, prior = params()
    scores.requires_grad_()
    assert torch.autograd.gradcheck(lambda s, a_, b_, al: loss(s, labels, a_, b_, al, prior, mask=mask),
                                    (scores, a, b, alpha))


def test_margin_loss_with_unit_margin_is_square_loss_shifted():
    scores, labels, mask = make_batch()
    a, b, alpha, prior = params()
    margin = auc_margin_loss(scores, labels, a, b, alpha, prior, mask=mask, reduction="none")
    square = auc_square_loss(scores, labels, a, b, alpha - 1, prior, mask=mask, reduction="none")
    defined = defined_diseases(labels, mask)
    assert torch.allclose(square[defined], (margin - prior * (1 - prior))[defined])


def test_closed_form_dual_direction_is_expected_gradient_over_prior_variance():
    # With a, b the class means of the batch and p its positive fraction, d loss / d alpha = p(1-p) d_alpha.
    scores, labels, _ = make_batch(n=20, c=1)
    labels[2, 0] = 0
    y = labels[:, 0]
    p = y.mean()
    a = scores[y == 1, 0].mean().reshape(1)
    b = scores[y == 0, 0].mean().reshape(1)
    alpha = torch.tensor([0.4], dtype=torch.float64, requires_grad=True)
    auc_margin_loss(scores, labels, a, b, alpha, p).backward()
    direction = auc_margin_dual_direction(a, b, alpha.detach(), margin=1.0)
    assert alpha.grad.item() == pytest.approx((p * (1 - p) * direction).item())
    assert direction.item() == pytest.approx(2 * (1 + b - a).item() - 0.8)
    assert clamp_alpha(torch.tensor([-1.0, 5.0, 2000.0])).tolist() == [0.0, 5.0, 999.0]


def test_undefined_and_masked_diseases_give_zero_value_and_zero_gradient():
    scores = torch.rand(6, 3, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([[1, 0, 1], [1, 0, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.float64)
    mask = torch.ones(6, 3, dtype=torch.bool)
    mask[:, 2] = False  # disease 2 masked everywhere; disease 0 has no negative
    a, b, alpha, prior = params()
    assert defined_diseases(labels, mask).tolist() == [False, True, False]
    for loss in (auc_margin_loss(scores, labels, a, b, alpha, prior, mask=mask, reduction="none"),
                 auc_square_loss(scores, labels, a, b, alpha, prior, mask=mask, reduction="none"),
                 pairwise_auc_loss(scores, labels, mask=mask, reduction="none")):
        assert loss[0].item() == 0.0 and loss[2].item() == 0.0 and loss[1].item() != 0.0
        scores.grad = None
        loss.sum().backward()
        assert torch.all(scores.grad[:, [0, 2]] == 0) and torch.all(torch.isfinite(scores.grad))


def test_nan_labels_are_masked_and_bad_labels_are_rejected():
    scores, labels, _ = make_batch()
    a, b, alpha, prior = params()
    nan_labels = labels.clone()
    nan_labels[5, 1] = float("nan")
    mask = torch.ones_like(labels, dtype=torch.bool)
    mask[5, 1] = False
    mask[2, 0] = False  # make_batch's NaN entry
    explicit = auc_margin_loss(scores, labels.nan_to_num(0.0), a, b, alpha, prior, mask=mask)
    assert auc_margin_loss(scores, nan_labels, a, b, alpha, prior).item() == pytest.approx(explicit.item())
    labels[4, 2] = 2.0
    with pytest.raises(ValueError, match=r"labels must be 0, 1 or NaN.*row 4, disease column 2"):
        auc_margin_loss(scores, labels, a, b, alpha, prior)
    with pytest.raises(ValueError, match="prior must lie strictly between 0 and 1"):
        auc_margin_loss(scores, nan_labels, a, b, alpha, torch.tensor([0.3, 0.0, 0.2]))
    with pytest.raises(ValueError, match=r"a must be a scalar or have shape \(3,\)"):
        auc_margin_loss(scores, nan_labels, torch.zeros(2), b, alpha, prior)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_and_saturated_scores_stay_finite(dtype):
    scores, labels, mask = make_batch(n=64, dtype=torch.float32)
    scores[:8] = 1.0
    scores[8:16] = 0.0
    a, b, alpha, prior = (t.float().detach() for t in params())
    reference = [auc_margin_loss(scores, labels, a, b, alpha, prior, mask=mask),
                 auc_square_loss(scores, labels, a, b, alpha, prior, mask=mask)]
    reference += [pairwise_auc_loss(scores, labels, surrogate=name, mask=mask) for name in SURROGATES]
    half = scores.to(dtype).requires_grad_()
    got = [auc_margin_loss(half, labels, a, b, alpha, prior, mask=mask),
           auc_square_loss(half, labels, a, b, alpha, prior, mask=mask)]
    got += [pairwise_auc_loss(half, labels, surrogate=name, mask=mask) for name in SURROGATES]
    for r, g in zip(reference, got):
        assert g.dtype == torch.float32 and torch.isfinite(g)
        assert g.item() == pytest.approx(r.item(), rel=0.03, abs=1e-3)
    sum(got).backward()
    assert half.grad.dtype == dtype and torch.all(torch.isfinite(half.grad))


def test_auc_margin_reaches_auc_one_on_separable_toy_problem():
    torch.manual_seed(0)
    n, c = 400, 2
    x = torch.randn(3 * n, 2)
    margins = torch.stack([x[:, 0] - 0.8, x[:, 1] - x[:, 0] - 1.0], dim=1)
    x = x[(margins.abs() > 0.1).all(1)][:n]  # linearly separable with a gap, imbalanced
    labels = (margins[(margins.abs() > 0.1).all(1)][:n] > 0).float()
    prior = labels.mean(0)
    model = nn.Linear(2, c)
    a = torch.zeros(c, requires_grad=True)
    b = torch.zeros(c, requires_grad=True)
    alpha = torch.zeros(c)
    lr = 1.0
    for _ in range(300):
        idx = torch.randint(0, n, (64,))
        scores = torch.sigmoid(model(x[idx]))
        loss = auc_margin_loss(scores, labels[idx], a, b, alpha, prior)
        model.zero_grad()
        a.grad = b.grad = None
        loss.backward()
        with torch.no_grad():
            for p in (*model.parameters(), a, b):
                p -= lr * p.grad
            alpha = clamp_alpha(alpha + lr * auc_margin_dual_direction(a, b, alpha) * defined_diseases(labels[idx]))
    with torch.no_grad():
        scores = torch.sigmoid(model(x)).numpy()
    for c_ in range(c):
        assert roc_auc_score(labels[:, c_].numpy(), scores[:, c_]) == 1.0


# --- 1.4 pairwise ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SURROGATES)
def test_pairwise_loss_matches_double_loop_and_finite_differences(name):
    scores, labels, mask = make_batch(n=10)
    got = pairwise_auc_loss(scores, labels, surrogate=name, mask=mask, reduction="none")
    ref = loop_pairwise(scores, labels, mask, SCALAR_SURROGATES[name])
    assert got.tolist() == pytest.approx(ref, rel=1e-12)
    scores.requires_grad_()
    # hinge kinks lie at t = 1, never reached by scores strictly inside (0, 1).
    assert torch.autograd.gradcheck(lambda s: pairwise_auc_loss(s, labels, surrogate=name, mask=mask), (scores,))


def test_surrogate_registry_parameters_and_stability():
    with pytest.raises(ValueError, match="valid choices: squared_hinge, square, hinge, logistic, sigmoid"):
        get_surrogate("exponential")
    with pytest.raises(ValueError, match="takes a margin, not a temperature"):
        get_surrogate("hinge", temperature=2.0)
    t = torch.tensor([-1.0, -0.3, 0.0, 0.4, 1.0], dtype=torch.float64)
    assert get_surrogate("squared_hinge", margin=0.5)(t).tolist() == pytest.approx(
        [max(0.5 - v, 0) ** 2 for v in t.tolist()])
    sig = get_surrogate("sigmoid", temperature=3.0)
    assert torch.allclose(sig(t) + sig(-t), torch.ones_like(t))  # the symmetry that bounds flipped pairs
    steep = get_surrogate("logistic", temperature=1e-4)(torch.tensor([-1.0, 1.0]))
    assert steep.tolist() == pytest.approx([1e4, 0.0])  # log(1 + e^10000) without overflow
    assert get_surrogate("sigmoid", temperature=1e4)(torch.tensor([-1.0, 1.0])).tolist() == [1.0, 0.0]


def test_sigmoid_surrogate_default_is_robust_to_flipped_labels():
    """Sigmoid (k = 2, the default) vs squared hinge with 20% of the labels flipped (FeDXL's claim)."""
    torch.manual_seed(1)
    n = 600
    x = torch.randn(n, 10)
    w_true = torch.randn(10)
    clean = (x @ w_true + 0.3 * torch.randn(n) > 1.0).float()
    noisy = clean.clone()
    flip = torch.rand(n) < 0.2
    noisy[flip] = 1 - noisy[flip]
    x_test = torch.randn(2000, 10)
    y_test = (x_test @ w_true > 1.0).float()
    aucs = {}
    for name in ("sigmoid", "squared_hinge"):
        torch.manual_seed(2)
        model = nn.Linear(10, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        for _ in range(200):
            idx = torch.randint(0, n, (128,))
            loss = pairwise_auc_loss(torch.sigmoid(model(x[idx])), noisy[idx, None], surrogate=name)
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            aucs[name] = roc_auc_score(y_test.numpy(), model(x_test)[:, 0].numpy())
    assert aucs["sigmoid"] > 0.9
    assert aucs["sigmoid"] >= aucs["squared_hinge"] - 0.01


# --- 1.5 KL-OPAUC ----------------------------------------------------------------------------------


def loop_kl_objective(pos, neg, lam, loss_of_t):
    """F = (1/n+) sum_i lam log((1/n-) sum_j exp(l(s_i - s_j)/lam)), with torch scalars so it can be differentiated."""
    total = 0
    for i in range(len(pos)):
        inner = 0
        for j in range(len(neg)):
            inner = inner + torch.exp(loss_of_t(pos[i] - neg[j]) / lam)
        total = total + lam * torch.log(inner / len(neg))
    return total / len(pos)


def test_kl_opauc_surrogate_gradient_is_exact_when_u_is_the_inner_mean():
    g = torch.Generator().manual_seed(3)
    pos = torch.rand(5, generator=g, dtype=torch.float64, requires_grad=True)
    neg = torch.rand(7, generator=g, dtype=torch.float64, requires_grad=True)
    lam = 0.5
    l_fn = get_surrogate("squared_hinge")
    u = kl_opauc_inner_mean(pos, neg, lam)
    ref_u = [sum(math.exp(max(1 - (pos[i] - neg[j]).item(), 0) ** 2 / lam) for j in range(7)) / 7 for i in range(5)]
    assert u.tolist() == pytest.approx(ref_u, rel=1e-12)
    assert not u.requires_grad
    grads = torch.autograd.grad(kl_opauc_surrogate(pos, neg, u, lam), (pos, neg))
    ref = torch.autograd.grad(loop_kl_objective(pos, neg, lam, l_fn), (pos, neg))
    for got, want in zip(grads, ref):
        assert torch.allclose(got, want, rtol=1e-10)


def test_kl_opauc_ema_rule_and_module_state():
    assert kl_opauc_ema(torch.tensor([0.0, 2.0]), torch.tensor([3.0, 4.0]), gamma=0.9).tolist() == pytest.approx([3.0, 3.8])
    loss = KLOPAUCLoss(num_samples=10, num_diseases=2, lam=1.0, gamma=0.5)
    scores = torch.tensor([[0.9, 0.2], [0.4, 0.7], [0.3, 0.6], [0.8, 0.1]], requires_grad=True)
    labels = torch.tensor([[1, 0], [0, 1], [0, float("nan")], [1, 0]])
    index = torch.tensor([7, 2, 5, 0])
    value = loss(scores, labels, index)
    g0 = kl_opauc_inner_mean(scores[[0, 3], 0], scores[[1, 2], 0])
    g1 = kl_opauc_inner_mean(scores[[1], 1], scores[[0, 3], 1])
    assert loss.u[[7, 0], 0].tolist() == pytest.approx(g0.tolist())
    assert loss.u[2, 1].item() == pytest.approx(g1.item())
    assert loss.u.count_nonzero().item() == 3  # row 5 is a negative (and its disease-1 label is missing)
    expected = (kl_opauc_surrogate(scores[[0, 3], 0], scores[[1, 2], 0], g0)
                + kl_opauc_surrogate(scores[[1], 1], scores[[0, 3], 1], g1)) / 2
    assert value.item() == pytest.approx(expected.item())
    value.backward()
    assert torch.all(torch.isfinite(scores.grad))
    loss(scores.detach(), labels, index)  # second visit: EMA with weight 0.5 on the new (equal) value
    assert loss.u[[7, 0], 0].tolist() == pytest.approx(g0.tolist())
    with pytest.raises(IndexError, match=r"index values must lie in \[0, 10\)"):
        loss(scores, labels, torch.tensor([0, 1, 2, 10]))
    only_neg = loss(scores, torch.zeros(4, 2), index, reduction="none")
    assert only_neg.tolist() == [0.0, 0.0]


def test_kl_opauc_u_tracks_true_inner_mean_on_fixed_model():
    g = torch.Generator().manual_seed(4)
    n = 200
    labels = (torch.rand(n, 1, generator=g) < 0.2).float()
    scores = torch.sigmoid(torch.randn(n, 1, generator=g) + 1.5 * labels)
    loss = KLOPAUCLoss(num_samples=n, num_diseases=1, lam=0.5, gamma=0.05)
    for _ in range(800):
        idx = torch.randperm(n, generator=g)[:32]
        loss(scores[idx], labels[idx], idx)
    pos = labels[:, 0] == 1
    truth = kl_opauc_inner_mean(scores[pos, 0], scores[~pos, 0], lam=0.5)
    tracked = loss.u[pos, 0]
    assert torch.all(tracked > 0)
    assert ((tracked - truth).abs() / truth).max().item() < 0.1
    assert ((tracked - truth).abs() / truth).mean().item() < 0.03


def test_kl_tpauc_gradient_is_exact_on_a_full_batch_first_visit():
    g = torch.Generator().manual_seed(6)
    scores = torch.rand(14, 1, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([1, 0] * 7, dtype=torch.float64)[:, None]
    lam, lam_pos = 0.7, 0.4
    loss = KLTPAUCLoss(14, 1, lam=lam, lam_pos=lam_pos).double()
    value = loss(scores, labels, torch.arange(14))
    grad = torch.autograd.grad(value, scores)[0]
    l_fn = get_surrogate("squared_hinge")
    pos, neg = scores[0::2, 0], scores[1::2, 0]
    outer = 0
    for i in range(len(pos)):  # F = lam_pos log mean_i exp(F_i / lam_pos), F_i = lam log mean_j exp(l_ij / lam)
        f_i = lam * torch.log(sum(torch.exp(l_fn(pos[i] - neg[j]) / lam) for j in range(len(neg))) / len(neg))
        outer = outer + torch.exp(f_i / lam_pos)
    reference = lam_pos * torch.log(outer / len(pos))
    assert torch.allclose(grad, torch.autograd.grad(reference, scores)[0], rtol=1e-10)
    v_true = (outer / len(pos)).item()
    assert loss.v.item() == pytest.approx(v_true)


def test_cvar_opauc_at_the_quantile_is_the_top_fraction_mean_with_its_gradient():
    g = torch.Generator().manual_seed(7)
    pos = torch.rand(4, generator=g, dtype=torch.float64, requires_grad=True)
    neg = torch.rand(10, generator=g, dtype=torch.float64, requires_grad=True)
    beta = 0.3  # the 3 largest of 10 pair losses per positive
    l_fn = get_surrogate("squared_hinge")
    top_means, var = 0, []
    for i in range(4):
        row = sorted((l_fn(pos[i] - neg[j]) for j in range(10)), key=lambda v: -v.item())
        top_means = top_means + sum(row[:3]) / 3
        var.append((row[2].item() + row[3].item()) / 2)  # any threshold between the 3rd and 4th largest is optimal
    reference = top_means / 4
    t = torch.tensor(var, dtype=torch.float64)
    value = cvar_opauc_surrogate(pos, neg, t, beta)
    assert value.item() == pytest.approx(reference.item())
    for got, want in zip(torch.autograd.grad(value, (pos, neg)), torch.autograd.grad(reference, (pos, neg))):
        assert torch.allclose(got, want)
    assert cvar_threshold_gradient(pos, neg, t, beta).tolist() == pytest.approx([0.0] * 4)


def test_cvar_module_thresholds_converge_to_the_partial_auc_value():
    g = torch.Generator().manual_seed(8)
    n = 120
    labels = (torch.rand(n, 1, generator=g) < 0.25).float()
    scores = torch.sigmoid(torch.randn(n, 1, generator=g) + labels)
    loss = CVaROPAUCLoss(n, 1, beta=0.3, eta=0.05)
    for _ in range(400):
        value = loss(scores, labels, torch.arange(n))  # full batch: a deterministic objective in t
    pos, neg = scores[labels[:, 0] == 1, 0], scores[labels[:, 0] == 0, 0]
    pair = get_surrogate("squared_hinge")(pos[:, None] - neg[None, :])
    k = 0.3 * neg.numel()
    top = pair.sort(1, descending=True).values
    exact = (top[:, : int(k)].sum(1) + (k - int(k)) * top[:, int(k)]) / k
    assert value.item() == pytest.approx(exact.mean().item(), rel=0.01)


# --- 1.6 ratio loss --------------------------------------------------------------------------------


def test_ratio_weight_and_loss_match_loop_reference():
    w = ratio_positive_weight(torch.tensor([10.0, 0.0, 1.0, 5.0]), torch.tensor([90.0, 50.0, 1e6, 0.0]))
    assert w.tolist() == pytest.approx([1.9, 501.0, 501.0, 1.0])
    logits = torch.tensor([[2.0, -1.0], [-3.0, 0.5], [0.0, 40.0], [-50.0, 1.0]], dtype=torch.float64)
    labels = torch.tensor([[1, 0], [0, float("nan")], [1, 1], [0, 0]], dtype=torch.float64)
    n_pos, n_neg = torch.tensor([1.0, 3.0]), torch.tensor([9.0, 3.0])
    weight = [1.9, 1.1]
    ref = []
    for c in range(2):
        terms = []
        for i in range(4):
            if math.isnan(labels[i, c]):
                continue
            p = 1 / (1 + math.exp(-logits[i, c].item()))
            y = labels[i, c].item()
            terms.append(-(weight[c] * y * math.log(p) + (1 - y) * math.log1p(-p)) if 0 < p < 1 else
                         (weight[c] * y * -logits[i, c].item() if p == 0 else (1 - y) * logits[i, c].item()))
        ref.append(sum(terms) / len(terms))
    assert ratio_loss(logits, labels, n_pos, n_neg, reduction="none").tolist() == pytest.approx(ref, rel=1e-6)
    assert masked_bce_with_logits(logits, labels, mask=torch.zeros(4, 2)).item() == 0.0


# --- 1.3 compositional building block --------------------------------------------------------------


def small_net():
    torch.manual_seed(5)
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 2)).double()


def test_inner_ce_step_is_one_gradient_step_and_leaves_batchnorm_buffers():
    model = small_net().train()
    x = torch.randn(16, 4, dtype=torch.float64)
    y = (torch.rand(16, 2) < 0.5).double()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    stepped = inner_ce_step(model, x, y, rho=0.1)
    out = functional_forward(model, {k: v.detach() for k, v in stepped.items()}, x)
    assert out.shape == (16, 2)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])  # neither the weights nor BN running stats moved
    reference = copy.deepcopy(model)  # its own forward updates its BN statistics, not the model's
    ce = masked_bce_with_logits(reference(x), y)
    grads = torch.autograd.grad(ce, list(reference.parameters()))
    for (name, w), g in zip(model.named_parameters(), grads):
        assert torch.allclose(stepped[name], w - 0.1 * g)
    functional_forward(model, trainable_parameters(model), x, update_buffers=True)
    assert not torch.equal(model[1].running_mean, before["1.running_mean"])


def test_inner_ce_step_vjp_matches_finite_differences_of_the_step_map():
    model = small_net().eval()  # eval: the CE is a fixed smooth function of w, as the finite difference needs
    x = torch.randn(16, 4, dtype=torch.float64)
    y = (torch.rand(16, 2) < 0.5).double()
    rho, eps = 0.3, 1e-6
    weights = trainable_parameters(model)
    z = {k: torch.randn_like(v) for k, v in weights.items()}
    exact = inner_ce_step_vjp(model, x, y, rho, z)

    def step_at(shift):
        with torch.no_grad():
            for k, w in weights.items():
                w.add_(shift * z[k])
        out = {k: v.detach() for k, v in inner_ce_step(model, x, y, rho).items()}
        with torch.no_grad():
            for k, w in weights.items():
                w.sub_(shift * z[k])
        return out

    plus, minus = step_at(eps), step_at(-eps)
    for k in weights:  # J = I - rho H is symmetric, so J^T z = J z = directional derivative along z
        assert torch.allclose(exact[k], (plus[k] - minus[k]) / (2 * eps), atol=1e-6)
    first_order = inner_ce_step_vjp(model, x, y, rho, z, exact=False)
    assert all(torch.equal(first_order[k], z[k]) for k in z)
    # create_graph=True gives the same J^T z through autograd of the step map.
    stepped = inner_ce_step(model, x, y, rho, create_graph=True)
    auto = torch.autograd.grad(sum((stepped[k] * z[k]).sum() for k in z), list(weights.values()))
    for k, g in zip(weights, auto):
        assert torch.allclose(g, exact[k])


def test_one_dimensional_binary_batch_is_one_disease():
    scores = torch.tensor([0.9, 0.1, 0.6, 0.4])
    labels = torch.tensor([1.0, 0.0, 1.0, 0.0])
    value = pairwise_auc_loss(scores, labels, surrogate="hinge", reduction="none")
    assert value.shape == (1,)
    assert value.item() == pytest.approx(np.mean([1 - 0.8, 1 - 0.5, 1 - 0.5, 1 - 0.2]))


def test_compositional_step_with_a_parameter_the_ce_never_reaches():
    class WithUnusedHead(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Linear(3, 2).double()
            self.unused = nn.Parameter(torch.ones(4, dtype=torch.float64))

        def forward(self, x):
            return self.body(x)

    model = WithUnusedHead()
    x, y = torch.randn(8, 3, dtype=torch.float64), (torch.rand(8, 2) < 0.5).double()
    stepped = inner_ce_step(model, x, y, rho=0.5)
    assert torch.equal(stepped["unused"], model.unused.detach())
    z = {k: torch.ones_like(v) for k, v in trainable_parameters(model).items()}
    vjp = inner_ce_step_vjp(model, x, y, 0.5, z)
    assert torch.equal(vjp["unused"], z["unused"])
    # a linear model's CE Hessian in the weights is X^T diag(p(1-p)) X / N per output: check one entry
    p = torch.sigmoid(model.body(x)).detach()
    h_w = torch.einsum("n,ni,nj->ij", p[:, 0] * (1 - p[:, 0]), x, x) / 8 / 2  # mean over 2 diseases
    h_wb = (p[:, 0] * (1 - p[:, 0]))[:, None].mul(x).sum(0) / 8 / 2
    expected_row0 = 1 - 0.5 * (h_w @ torch.ones(3, dtype=torch.float64) + h_wb)
    assert torch.allclose(vjp["body.weight"][0], expected_row0)
