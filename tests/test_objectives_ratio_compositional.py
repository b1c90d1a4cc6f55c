"""The ratio loss (docs/algorithms.md section 1.6) against a loop reference, and the compositional building block
(section 1.3: one inner cross-entropy step and its vector-Jacobian product) against finite differences."""

import copy
import math

import numpy as np
import pytest
import torch
from torch import nn

from models.compositional import functional_forward, inner_ce_step, inner_ce_step_vjp, trainable_parameters
from models.objectives import (
    masked_bce_with_logits,
    pairwise_auc_loss,
    ratio_loss,
    ratio_positive_weight,
)

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
