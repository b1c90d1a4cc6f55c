"""Objectives (docs/algorithms.md section 1) against brute-force references written as explicit loops, and finite differences."""

import math

import pytest
import torch
from sklearn.metrics import roc_auc_score
from torch import nn

from models.objectives import (
    SURROGATES,
    auc_margin_dual_direction,
    auc_margin_loss,
    auc_square_loss,
    clamp_alpha,
    defined_diseases,
    get_surrogate,
    pairwise_auc_loss,
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
