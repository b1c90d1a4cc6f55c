"""The partial-AUC objectives (docs/algorithms.md section 1.5: KL-OPAUC, KL-TPAUC, CVaR-OPAUC) against brute-force
references written as explicit loops, and their exact gradients."""

import math

import pytest
import torch

from models.objectives import (
    CVaROPAUCLoss,
    KLOPAUCLoss,
    KLTPAUCLoss,
    cvar_opauc_surrogate,
    cvar_threshold_gradient,
    get_surrogate,
    kl_opauc_ema,
    kl_opauc_inner_mean,
    kl_opauc_surrogate,
)

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
